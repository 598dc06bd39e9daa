#include "tiermoe/report/html_report.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/report/svg_chart.h"

namespace tiermoe {

namespace fs = std::filesystem;
using detail::str_of;

namespace {

// Two palettes with the same roles. Series colours keep at least 3:1 contrast
// against their page in both readings; the heat ramp is one hue at rising
// opacity over the page colour, so it reads the same way in both.
constexpr const char* kStyle = R"css(
:root { color-scheme: light dark;
  --bg: #ffffff; --fg: #1f2328; --muted: #59636e; --grid: #d1d9e0; --axis: #59636e;
  --panel: #f6f8fa; --border: #d1d9e0; --heat: #0550ae; --res: #cf222e; --ref: #1f2328;
  --mark: #8250df;
  --c0: #0969da; --c1: #cf222e; --c2: #1a7f37; --c3: #9a6700; --c4: #8250df; --c5: #6e7781;
  --c6: #bc4c00; --c7: #1b7c83; }
@media (prefers-color-scheme: dark) { :root {
  --bg: #0d1117; --fg: #e6edf3; --muted: #9198a1; --grid: #30363d; --axis: #9198a1;
  --panel: #151b23; --border: #3d444d; --heat: #79c0ff; --res: #ff7b72; --ref: #e6edf3;
  --mark: #d2a8ff;
  --c0: #58a6ff; --c1: #ff7b72; --c2: #3fb950; --c3: #d29922; --c4: #bc8cff; --c5: #9198a1;
  --c6: #ffa657; --c7: #39c5cf; } }
body { background: var(--bg); color: var(--fg); margin: 0 auto; max-width: 820px;
  padding: 16px 20px 40px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 20px; margin: 4px 0 2px; } h2 { font-size: 16px; margin: 28px 0 6px; }
.src, .note, .absent { color: var(--muted); font-size: 12.5px; margin: 2px 0 6px; }
.live { border: 1px solid var(--mark); border-radius: 6px; padding: 6px 10px; margin: 8px 0; }
table.summary { border-collapse: collapse; margin: 8px 0 4px; }
table.summary td { padding: 2px 14px 2px 0; } table.summary td:first-child { color: var(--muted); }
figure.chart { margin: 10px 0 18px; padding: 10px 12px 6px; background: var(--panel);
  border: 1px solid var(--border); border-radius: 8px; }
figcaption { font-weight: 600; }
svg { display: block; width: 100%; height: auto; margin-top: 4px; }
svg text { fill: var(--fg); font-size: 12px; } svg text.tick { fill: var(--muted); font-size: 11px; }
.grid { stroke: var(--grid); stroke-width: 1; } .axis { stroke: var(--axis); stroke-width: 1; }
.c0 { --c: var(--c0); } .c1 { --c: var(--c1); } .c2 { --c: var(--c2); } .c3 { --c: var(--c3); }
.c4 { --c: var(--c4); } .c5 { --c: var(--c5); } .c6 { --c: var(--c6); } .c7 { --c: var(--c7); }
.ln { fill: none; stroke: var(--c); stroke-width: 1.8; stroke-linejoin: round; }
.ln.dash { stroke-dasharray: 5 3; } .dot { fill: var(--c); }
.area { fill: var(--c); fill-opacity: 0.8; stroke: none; }
.ref { stroke: var(--ref); stroke-width: 1.3; stroke-dasharray: 2 3; }
.mark { stroke: var(--mark); stroke-width: 1.2; stroke-dasharray: 4 3; }
.heat { fill: var(--heat); } .res { fill: none; stroke: var(--res); stroke-width: 2; }
ul.legend { list-style: none; padding: 0; margin: 4px 0 0; display: flex; flex-wrap: wrap;
  gap: 2px 16px; font-size: 12.5px; }
.sw { display: inline-block; width: 16px; height: 10px; margin-right: 6px; vertical-align: middle;
  box-sizing: border-box; }
.sw.ln { height: 0; border-top: 2.5px solid var(--c); } .sw.ln.dash { border-top-style: dashed; }
.sw.area, .sw.dot { background: var(--c); } .sw.dot { width: 8px; height: 8px; border-radius: 4px; }
.sw.ref { height: 0; border-top: 2px dotted var(--ref); }
.sw.mark { width: 0; height: 14px; border-left: 2px dashed var(--mark); margin: 0 10px 0 6px; }
.sw.res { border: 2px solid var(--res); }
.ramp { display: inline-block; width: 60px; height: 10px; margin-right: 6px; vertical-align: middle;
  background: linear-gradient(to right, var(--bg), var(--heat)); border: 1px solid var(--border); }
)css";

// Counts the charts onto <html data-charts>, for a headless check.
constexpr const char* kScript =
    "document.documentElement.dataset.charts = "
    "document.querySelectorAll('figure[data-chart] svg').length;";

double last_or_zero(const std::vector<double>& v) { return v.empty() ? 0.0 : v.back(); }

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string summary_table(const ReportInputs& in) {
  std::ostringstream os;
  os << "<table class=\"summary\">";
  const auto row = [&](const std::string& k, const std::string& v) {
    os << "<tr><td>" << html_escape(k) << "</td><td>" << html_escape(v) << "</td></tr>";
  };
  if (in.run) {
    const RunSeries& r = *in.run;
    const double step = last_or_zero(r.step);
    row("steps",
        r.total_steps > 0 ? str_of(int64_t(step), " of ", r.total_steps) : str_of(int64_t(step)));
    char loss[96];
    if (r.loss_floor) {
      std::snprintf(loss, sizeof loss, "%.4f (floor %.4f, %.4f above it)", last_or_zero(r.loss),
                    *r.loss_floor, last_or_zero(r.loss) - *r.loss_floor);
    } else {
      std::snprintf(loss, sizeof loss, "%.4f", last_or_zero(r.loss));
    }
    row("last loss", loss);
    row("tokens/s (median)", format_value(median_of(r.tokens_per_s), ValueKind::plain));
    row("step time (median)", format_value(median_of(r.step_time_s), ValueKind::seconds));
    if (r.has_tier) {
      int64_t resident = 0;
      for (const auto& ids : r.resident_last) resident += int64_t(ids.size());
      row("hot fraction (last step)",
          format_value(last_or_zero(r.hot_fraction), ValueKind::fraction));
      row("experts on the device", str_of(resident, " after the last step, ",
                                          r.replacement_steps.size(), " re-placement(s)"));
    }
  }
  if (in.plan) {
    const PlanSeries& p = *in.plan;
    row("plan: hot fraction", format_value(p.hot_fraction, ValueKind::fraction));
    row("plan: expert time per step", format_value(p.step_s, ValueKind::seconds) + " (all-host " +
                                          format_value(p.all_host_step_s, ValueKind::seconds) +
                                          ")");
    row("plan: device memory", format_value(p.bytes, ValueKind::bytes) + " of " +
                                   format_value(p.budget_bytes, ValueKind::bytes));
  }
  os << "</table>";
  return os.str();
}

std::string absent(const std::string& what) {
  return "<p class=\"absent\">" + html_escape(what) + "</p>\n";
}

void run_charts(const ReportInputs& in, std::ostringstream& os, std::vector<std::string>& names) {
  const RunSeries& r = *in.run;
  // Every run chart is over steps, from 0 so that step 1 clears the axis.
  const auto chart = [&](LineChartSpec spec) {
    names.push_back(spec.id);
    if (!spec.x_min) spec.x_min = 0.0;
    os << line_chart_html(spec);
  };

  os << "<h2>Loss and learning rate</h2>\n";
  LineChartSpec loss{
      .id = "loss", .title = "Loss per step", .x_label = "step", .y_label = "loss (nats/token)"};
  loss.lines.push_back({.name = "training loss", .x = r.step, .y = r.loss, .color = 0});
  if (!r.eval_loss.empty()) {
    loss.lines.push_back(
        {.name = "eval loss", .x = r.eval_step, .y = r.eval_loss, .color = 1, .dots = true});
  }
  if (r.loss_floor) loss.refs.push_back({"entropy floor", *r.loss_floor});
  chart(loss);
  chart({.id = "lr",
         .title = "Learning rate",
         .x_label = "step",
         .y_label = "learning rate",
         .lines = {{.name = "lr", .x = r.step, .y = r.lr, .color = 2}}});

  os << "<h2>Speed</h2>\n";
  chart({.id = "throughput",
         .title = "Throughput",
         .x_label = "step",
         .y_label = "tokens/s",
         .lines = {{.name = "tokens/s", .x = r.step, .y = r.tokens_per_s, .color = 0}}});
  LineChartSpec time{.id = "time",
                     .title = "Where the step time goes",
                     .x_label = "step",
                     .y_label = "time per step",
                     .y_kind = ValueKind::seconds,
                     .stacked = true};
  if (r.has_parts) {
    // The whole step's disjoint parts (train's time_split_s), largest kinds
    // of work first; parts no line has time for are left out.
    static constexpr const char* kLabels[kNumStepParts + 1] = {"data",
                                                               "embedding",
                                                               "norms, RoPE, residual adds",
                                                               "projections (LoRA included)",
                                                               "attention core",
                                                               "router",
                                                               "dispatch and combine",
                                                               "experts on the host",
                                                               "waiting for the device",
                                                               "LM head and loss",
                                                               "optimizer (and tier moves)",
                                                               "other"};
    int color = 0;
    for (size_t p = 0; p <= kNumStepParts; ++p) {
      std::vector<double> y = r.time.parts[p];
      bool any = false;
      for (double& v : y) {
        v = std::max(0.0, v);  // "other" can read -0.0001 s of clock jitter
        any |= v > 0;
      }
      if (!any) continue;
      time.lines.push_back({.name = kLabels[p], .x = r.step, .y = std::move(y), .color = color++});
    }
    time.note = "Stacked: the parts add up to the step's wall time (other: what no part covers).";
  } else if (r.has_time_split) {
    const StepTimeSplit& t = r.time;
    time.lines.push_back({.name = "attention", .x = r.step, .y = t.attention_s, .color = 0});
    if (r.has_tier) {
      time.lines.push_back(
          {.name = "experts on the host", .x = r.step, .y = t.host_experts_s, .color = 3});
      time.lines.push_back(
          {.name = "waiting for the device", .x = r.step, .y = t.wait_s, .color = 1});
      time.lines.push_back(
          {.name = "routing, dispatch, combine", .x = r.step, .y = t.mlp_other_s, .color = 2});
      time.lines.push_back(
          {.name = "tier moves and weight syncs", .x = r.step, .y = t.tier_moves_s, .color = 4});
    } else {
      time.lines.push_back(
          {.name = "MoE blocks and MLPs", .x = r.step, .y = t.mlp_other_s, .color = 3});
    }
    time.lines.push_back(
        {.name = "embedding, LM head, loss, optimizer", .x = r.step, .y = t.other_s, .color = 5});
    time.note = "Stacked: the parts add up to the step's wall time.";
  } else {
    time.stacked = false;
    time.lines.push_back({.name = "step time", .x = r.step, .y = r.step_time_s, .color = 0});
    time.note = "These metrics carry no attention_s / mlp_s: only the whole step is drawn.";
  }
  chart(time);

  os << "<h2>Device tier</h2>\n";
  if (!r.has_tier) {
    os << absent("No device tier in this run (train --device cpu|cuda --device-memory BYTES).");
  } else {
    chart({.id = "device",
           .title = "Device time per step",
           .note = "The device runs beside the host: its busy time overlaps the host's work.",
           .x_label = "step",
           .y_label = "time per step",
           .y_kind = ValueKind::seconds,
           .lines = {{.name = "device stream busy", .x = r.step, .y = r.time.device_s, .color = 0},
                     {.name = "of which transfers",
                      .x = r.step,
                      .y = r.time.transfer_s,
                      .color = 1,
                      .dashed = true},
                     {.name = "experts on the host",
                      .x = r.step,
                      .y = r.time.host_experts_s,
                      .color = 3}}});
    double drift_hi = 0;
    for (double d : r.drift) drift_hi = std::max(drift_hi, d);
    chart({.id = "tier",
           .title = "Hot fraction and routing drift",
           .note = "Hot fraction: the share of routed rows the device computed. Drift: L1 change "
                   "of the routing profile (0 to 2).",
           .x_label = "step",
           .y_label = "fraction",
           .y_kind = ValueKind::fraction,
           .lines = {{.name = "hot fraction", .x = r.step, .y = r.hot_fraction, .color = 0},
                     {.name = "routing drift", .x = r.step, .y = r.drift, .color = 6}},
           .marks = r.replacement_steps,
           .marks_name = "re-placement",
           .y_min = 0.0,
           .y_max = std::max(1.0, drift_hi * 1.05)});
  }

  os << "<h2>Routing load</h2>\n";
  if (in.run_load) {
    const LoadMap& m = *in.run_load;
    names.push_back("load-run");
    os << heatmap_html({.id = "load-run",
                        .title = "Routing load per MoE layer and expert",
                        .note = "Average rows per step (the routing profile, " + m.source +
                                "); outlined: resident on the device after the last step.",
                        .value_YX = m.rows_LE,
                        .outlined_YX = m.resident_LE});
  } else {
    os << absent(
        "No routing profile: run with --device and --out (checkpoints hold it), or "
        "pass --profile FILE.");
  }

  os << "<h2>Memory</h2>\n";
  LineChartSpec mem{.id = "memory",
                    .title = "Live memory by tag",
                    .x_label = "step",
                    .y_label = "bytes",
                    .y_kind = ValueKind::bytes,
                    .legend_last = true};
  int color = 0;
  for (const std::string& tag : r.memory_tags) {
    mem.lines.push_back({.name = tag, .x = r.step, .y = r.memory_live.at(tag), .color = color++});
  }
  if (in.plan && in.plan->bytes > 0) {
    mem.refs.push_back({"plan: device memory of its placement", in.plan->bytes});
  }
  if (!mem.lines.empty()) {
    chart(mem);
  } else {
    os << absent("These metrics carry no memory_bytes.");
  }
}

void plan_chart(const ReportInputs& in, std::ostringstream& os, std::vector<std::string>& names) {
  const PlanSeries& p = *in.plan;
  os << "<h2>Plan</h2>\n";
  if (!p.load) {
    os << absent("The plan carries no routing rows (made by an older tiermoe plan).");
    return;
  }
  names.push_back("load-plan");
  os << heatmap_html({.id = "load-plan",
                      .title = "The plan: routing load and placement",
                      .note = "tiermoe plan (" + p.source +
                              "): its profile's rows per step; "
                              "outlined: the experts it would hold on the device.",
                      .value_YX = p.load->rows_LE,
                      .outlined_YX = p.load->resident_LE,
                      .outlined_name = "planned on the device"});
}

std::string page(const ReportInputs& in, std::vector<std::string>& names) {
  std::ostringstream body;
  if (in.run) run_charts(in, body, names);
  if (in.plan) plan_chart(in, body, names);

  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
     << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">";
  if (in.live) os << "<meta http-equiv=\"refresh\" content=\"" << in.refresh_s << "\">";
  os << "<title>" << html_escape(in.title) << "</title><style>" << kStyle << "</style></head>\n"
     << "<body><h1>" << html_escape(in.title) << "</h1>\n";
  if (in.run) os << "<p class=\"src\">metrics: " << html_escape(in.run->source) << "</p>\n";
  if (in.live && in.run) {
    const RunSeries& r = *in.run;
    os << "<p class=\"live\">Running: written at step " << int64_t(last_or_zero(r.step))
       << (r.total_steps > 0 ? str_of(" of ", r.total_steps) : std::string())
       << "; this page reloads every " << in.refresh_s << " s.</p>\n";
  }
  os << summary_table(in) << "\n"
     << body.str() << "<script>" << kScript << "</script>"
     << "</body></html>\n";
  return os.str();
}

}  // namespace

std::string render_report_html(const ReportInputs& in) {
  TIERMOE_CHECK(in.run || in.plan, "nothing to report", "report",
                "give a run's metrics (or run dir) and/or --plan FILE");
  std::vector<std::string> names;
  return page(in, names);
}

std::vector<std::string> report_chart_names(const ReportInputs& in) {
  std::vector<std::string> names;
  if (in.run || in.plan) page(in, names);
  return names;
}

void write_report(const std::string& path, const std::string& html) {
  write_file_atomic(path, html);
}

}  // namespace tiermoe
