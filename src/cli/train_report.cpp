#include "train_report.h"

#include <filesystem>
#include <iostream>

#include "tiermoe/core/error.h"
#include "tiermoe/report/html_report.h"
#include "tiermoe/train/checkpoint.h"

namespace tiermoe::cli {

namespace {

namespace fs = std::filesystem;

// The routing profile beside a checkpoint, when the run had a device tier.
std::string checkpoint_profile(const std::string& checkpoint) {
  const fs::path p = fs::path(checkpoint) / kRoutingProfileFile;
  return !checkpoint.empty() && fs::exists(p) ? p.string() : std::string();
}

void write_page(const std::string& report, const std::string& metrics, const std::string& profile,
                bool live) {
  ReportInputs in = load_report_inputs({.metrics = metrics, .profile = profile});
  in.live = live;
  write_report(report, render_report_html(in));
}

}  // namespace

void prepare_train_report(const std::string& report, RunControl& control) {
  // The report may go into the run's own directory (--report OUT/report.html).
  if (!control.out_dir.empty()) fs::create_directories(control.out_dir);
  if (control.metrics_file.empty()) {
    TIERMOE_CHECK(!control.out_dir.empty(), "the report needs the run's metrics", "--report",
                  "pass --metrics FILE, or --out DIR (the metrics then go to DIR/metrics.jsonl)");
    control.metrics_file = (fs::path(control.out_dir) / "metrics.jsonl").string();
  }
  const std::string metrics = control.metrics_file;
  std::ostream* log = control.log;
  control.after_checkpoint = [report, metrics, log](const std::string& checkpoint) {
    // A report that cannot be refreshed must not stop the training.
    try {
      write_page(report, metrics, checkpoint_profile(checkpoint), /*live=*/true);
    } catch (const std::exception& e) {
      if (log) *log << "train: warning: the report was not refreshed: " << e.what() << "\n";
    }
  };
}

void write_train_report(const std::string& report, const RunControl& control,
                        const TrainSummary& summary, const std::string& profile_out) {
  std::string profile = checkpoint_profile(summary.last_checkpoint);
  if (profile.empty() && !profile_out.empty() && fs::exists(profile_out)) profile = profile_out;
  write_page(report, control.metrics_file, profile, /*live=*/false);
  if (control.log) *control.log << "train: report written to " << report << "\n";
}

}  // namespace tiermoe::cli
