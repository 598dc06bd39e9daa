#include <filesystem>

#include "tiermoe/core/error.h"
#include "tiermoe/report/html_report.h"
#include "tiermoe/report/report_data.h"
#include "tiermoe/train/checkpoint.h"

namespace tiermoe {

namespace fs = std::filesystem;

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
  return in;
}

}  // namespace tiermoe
