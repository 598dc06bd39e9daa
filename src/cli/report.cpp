// tiermoe report: a training run as one self-contained HTML page (loss, lr,
// speed and the step-time split, the device tier's hot fraction and drift,
// the routing load with the resident experts, memory by tag), from the files
// the run left; --plan adds a tiermoe plan --json's placement beside it.
// The page's contents are report/html_report.h's.
#include <iostream>

#include "commands.h"
#include "run_paths.h"
#include "tiermoe/core/error.h"
#include "tiermoe/report/html_report.h"

namespace tiermoe::cli {

namespace {

struct ReportFlags {
  std::string run, profile, plan, out;
};

void run_report(const ReportFlags& f) {
  TIERMOE_CHECK(!f.run.empty() || !f.plan.empty(), "nothing to report", "tiermoe report",
                "pass a train --out directory or a --metrics file, and/or --plan FILE");
  ReportSources sources = f.run.empty() ? ReportSources{} : report_sources_for(f.run);
  if (!f.profile.empty()) sources.profile = f.profile;
  sources.plan = f.plan;
  RunPaths paths;
  paths.input_file(sources.metrics, f.run);
  paths.input_file(sources.profile, f.profile.empty() ? f.run : "--profile");
  paths.input_file(sources.plan, "--plan");
  paths.output(f.out, "--out");
  paths.check();
  const ReportInputs in = load_report_inputs(sources);
  write_report(f.out, render_report_html(in));
  std::cerr << "report: " << report_chart_names(in).size() << " charts written to " << f.out
            << "\n";
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto f = std::make_shared<ReportFlags>();
  CLI::App* cmd = app.add_subcommand(
      "report", "A training run (and/or a plan) as one self-contained HTML page of charts");
  cmd->add_option("RUN_DIR_OR_METRICS", f->run,
                  "A train --out directory (its metrics.jsonl and latest checkpoint's routing "
                  "profile) or a train --metrics file");
  cmd->add_option("--profile", f->profile,
                  "Routing profile for the load heatmap (default: the run dir's latest "
                  "checkpoint's)");
  cmd->add_option("--plan", f->plan, "What tiermoe plan --json printed: its placement and load");
  cmd->add_option("--out", f->out, "The HTML file to write")->required();
  cmd->callback([f] { run_report(*f); });
}

}  // namespace tiermoe::cli
