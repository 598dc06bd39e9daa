#pragma once
// A small chart writer for the run report: line charts (lines, stacked
// areas, horizontal reference lines, vertical markers) and a heatmap, each
// as an HTML <figure> holding an inline SVG and an HTML legend.
//
// Colours are never written here: every mark carries a class (`c0`..`c7`
// for series, `ref`, `mark`, `grid`, `axis`, `heat`, `res`) and the page's
// stylesheet (report/html_report.h) gives them colours for the light and the
// dark reading. Each figure has data-chart="ID" so a check can count them.
//
// Axes have ticks at 1-2-5 steps with values in the axis's unit (bytes in
// KiB/MiB/GiB, seconds in ms or s, large counts with k/M/G). Lines with more
// than max_points points are thinned by keeping every n-th point and the
// last; the series themselves are the data layer's.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tiermoe {

enum class ValueKind { plain, seconds, bytes, fraction };

// Tick values covering [lo, hi] at a 1-2-5 step, about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 5,
                               ValueKind kind = ValueKind::plain);
// A tick label: "250 ms", "1.5 s", "512 MiB", "12k", "0.25", "3e-05".
std::string format_value(double v, ValueKind kind);
// Escapes &, <, >, " for HTML text and attributes.
std::string html_escape(const std::string& s);

struct ChartLine {
  std::string name;
  std::vector<double> x, y;
  int color = 0;        // c0..c7
  bool dashed = false;  // e.g. a second, thinner reading of the same thing
  bool dots = false;    // points only (sparse series: eval loss)
};

struct RefLine {  // a horizontal line across the plot: a floor, a budget
  std::string name;
  double y = 0;
};

struct LineChartSpec {
  std::string id, title, note;   // note: a line of text under the title
  std::string x_label, y_label;  // with units, e.g. "step", "time per step (s)"
  ValueKind y_kind = ValueKind::plain;
  std::vector<ChartLine> lines;
  bool stacked = false;  // lines are areas stacked in order, bottom first
  std::vector<RefLine> refs;
  std::vector<double> marks;    // vertical markers at these x
  std::string marks_name;       // the legend's word for them
  std::optional<double> y_min;  // default: 0 when every value is >= 0, else the data's
  std::optional<double> y_max;
  std::optional<double> x_min;  // default: the data's (steps: 0, so step 1 clears the axis)
  bool legend_last = false;     // the legend gives each line's last value (lines that overlap)
  int max_points = 1500;
};
std::string line_chart_html(const LineChartSpec& spec);

struct HeatmapSpec {
  std::string id, title, note;
  std::string x_label = "expert", y_label = "MoE layer", value_label = "rows per step";
  std::vector<std::vector<double>> value_YX;      // [row][column], >= 0
  std::vector<std::vector<uint8_t>> outlined_YX;  // [row][column], 1 = outlined
  std::string outlined_name = "on the device";
};
std::string heatmap_html(const HeatmapSpec& spec);

}  // namespace tiermoe
