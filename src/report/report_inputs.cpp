#include <filesystem>

#include "tiermoe/core/error.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/report/html_report.h"
#include "tiermoe/report/report_data.h"
#include "tiermoe/train/checkpoint.h"

namespace tiermoe {

namespace fs = std::filesystem;
using detail::str_of;

std::string run_dir_metrics(const std::string& dir) {
  return (fs::path(dir) / "metrics.jsonl").string();
}

std::string run_dir_profile(const std::string& dir) {
  if (!has_checkpoints(dir)) return {};
  const fs::path p = fs::path(resolve_checkpoint(dir)) / kRoutingProfileFile;
  return fs::exists(p) ? p.string() : std::string();
}

ReportSources report_sources_for(const std::string& path) {
  ReportSources s;
  if (fs::is_directory(path)) {
    s.metrics = run_dir_metrics(path);
    TIERMOE_CHECK(fs::exists(s.metrics), "the run directory holds no metrics.jsonl", path,
                  "pass the metrics file itself, or train with --out DIR --report (which writes "
                  "DIR/metrics.jsonl)");
    s.profile = run_dir_profile(path);
    if (has_checkpoints(path)) {
      const fs::path config = fs::path(resolve_checkpoint(path)) / "config.json";
      if (fs::exists(config)) s.model_config = config.string();
    }
  } else {
    TIERMOE_CHECK(fs::exists(path), "no such file or directory", path,
                  "pass a train --out directory or a train --metrics file");
    s.metrics = path;
  }
  return s;
}

ReportInputs load_report_inputs(const ReportSources& s) {
  ReportInputs in;
  if (!s.metrics.empty()) in.run = read_metrics(s.metrics);
  if (!s.profile.empty()) {
    in.run_load = load_map_from_profile(
        s.profile, in.run ? in.run->resident_last : std::vector<std::vector<int64_t>>{});
  }
  if (!s.plan.empty()) in.plan = read_plan(s.plan);
  // The shape the maps must have: the run's model's, else the first map's.
  std::string shape_of;
  int64_t layers = 0, experts = 0;
  if (!s.model_config.empty()) {
    const ModelConfig c = load_model_config(s.model_config);
    shape_of = "the run's model (" + s.model_config + ")";
    layers = c.num_moe_layers();
    experts = c.num_experts;
  }
  for (const LoadMap* m : {in.run_load ? &*in.run_load : nullptr,
                           in.plan && in.plan->load ? &*in.plan->load : nullptr}) {
    if (m == nullptr) continue;
    if (shape_of.empty()) {
      shape_of = m->source;
      layers = m->layers;
      experts = m->experts;
      continue;
    }
    TIERMOE_CHECK(m->layers == layers && m->experts == experts,
                  str_of("its load is ", m->layers, " MoE layers x ", m->experts, " experts; ",
                         shape_of, " has ", layers, " x ", experts),
                  m->source, "pass the routing profile and plan of this run's model");
  }
  return in;
}

}  // namespace tiermoe
