#pragma once
// The run report: one self-contained HTML page (inline SVG and CSS, one
// inline script, no network, no external files) drawn from the data layer's
// series (report/report_data.h):
//
//   summary      steps, final loss beside the floor, tokens/s, step time, hot fraction
//   loss         loss per step, the entropy floor when known, eval loss when present
//   lr           the learning rate
//   throughput   tokens/s
//   time         the step's wall time split: attention, MoE host experts, waiting
//                for the device, the rest of the MoE blocks, tier moves, other
//   device       device stream busy and transfers per step (it runs beside the host)
//   tier         hot fraction and routing drift, re-placements marked
//   load-run     layer x expert routing load, device-resident experts outlined
//   load-plan    the same for a tiermoe plan (its profile and placement)
//   memory       live bytes by tag per step, with the plan's prediction
//
// Each chart is a <figure data-chart="NAME">; charts without data (no tier,
// no plan) are left out and a line says why. The stylesheet has a light and
// a dark palette (prefers-color-scheme). The inline script counts the charts
// into <html data-charts="N">, so a headless browser's DOM shows they loaded.
#include <optional>
#include <string>

#include "tiermoe/report/report_data.h"

namespace tiermoe {

struct ReportInputs {
  std::optional<RunSeries> run;
  std::optional<LoadMap> run_load;  // the run's routing profile with its resident experts
  std::optional<PlanSeries> plan;
  // The run is still going (train --report at a checkpoint): the page
  // reloads itself every `refresh_s` seconds and says so.
  bool live = false;
  int refresh_s = 30;
  std::string title = "TierMoE run report";
};

// The files a report reads; empty: not read.
struct ReportSources {
  std::string metrics;  // train --metrics JSONL
  std::string profile;  // a routing profile (default for a run dir: its latest checkpoint's)
  std::string plan;     // what tiermoe plan --json printed
  // The run's model (a run dir's latest checkpoint's config.json): the
  // profile's and the plan's layers x experts must be its own.
  std::string model_config;
};
// RUN_DIR_OR_METRICS as `tiermoe report` takes it: a directory is a train
// --out directory (DIR/metrics.jsonl, the latest checkpoint's profile), a
// file is the metrics themselves.
ReportSources report_sources_for(const std::string& run_dir_or_metrics);
// Reads every source given. The run's load map pairs the profile with the
// experts the metrics' last step had resident. A profile or plan of another
// shape than the run's model (or than each other) is an Error naming it.
ReportInputs load_report_inputs(const ReportSources& sources);

std::string render_report_html(const ReportInputs& in);
// The names of the charts render_report_html draws for `in`, in page order.
std::vector<std::string> report_chart_names(const ReportInputs& in);

// Writes `html` to `path` atomically (a temporary file, then rename), so a
// browser reloading a live report never reads half a page.
void write_report(const std::string& path, const std::string& html);

}  // namespace tiermoe
