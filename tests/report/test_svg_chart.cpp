// The chart writer's axes and marks: ticks at 1-2-5 steps in the axis's
// unit, labels that say the unit, escaping, and one mark per point drawn.
#include <gtest/gtest.h>

#include <string>

#include "tiermoe/report/svg_chart.h"

namespace tiermoe {
namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(SvgChart, TicksCoverTheRangeAtOneTwoFiveSteps) {
  EXPECT_EQ(nice_ticks(0, 9.3), (std::vector<double>{0, 2, 4, 6, 8}));
  EXPECT_EQ(nice_ticks(1.6, 2.05), (std::vector<double>{1.6, 1.7, 1.8, 1.9, 2.0}));
  EXPECT_EQ(nice_ticks(0, 100), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  // Bytes step in binary units: 0, 256 MiB, ... 1 GiB.
  const std::vector<double> b = nice_ticks(0, 1100.0 * 1024 * 1024, 5, ValueKind::bytes);
  ASSERT_GE(b.size(), 2u);
  EXPECT_EQ(b[1], 256.0 * 1024 * 1024);
  // A flat series still gets an axis around its value.
  const std::vector<double> flat = nice_ticks(5, 5);
  ASSERT_GE(flat.size(), 2u);
  EXPECT_LE(flat.front(), 5.0);
  EXPECT_GT(flat.back(), 5.0);
}

TEST(SvgChart, LabelsCarryTheirUnits) {
  EXPECT_EQ(format_value(0.25, ValueKind::seconds), "250 ms");
  EXPECT_EQ(format_value(1.5, ValueKind::seconds), "1.5 s");
  EXPECT_EQ(format_value(512.0 * 1024 * 1024, ValueKind::bytes), "512 MiB");
  EXPECT_EQ(format_value(1536.0, ValueKind::bytes), "1.5 KiB");
  EXPECT_EQ(format_value(74700, ValueKind::plain), "74.7k");
  EXPECT_EQ(format_value(0.003, ValueKind::plain), "0.003");
  EXPECT_EQ(html_escape("a<b & \"c\">"), "a&lt;b &amp; &quot;c&quot;&gt;");
}

TEST(SvgChart, ALineChartDrawsEachPointEachRefAndEachMark) {
  LineChartSpec spec{.id = "t", .title = "T <1>", .x_label = "step", .y_label = "loss (nats)"};
  spec.lines.push_back({.name = "a", .x = {1, 2, 3}, .y = {3, 2, 1}});
  spec.lines.push_back({.name = "b", .x = {1, 3}, .y = {2.5, 1.5}, .color = 1, .dots = true});
  spec.refs.push_back({"floor", 0.5});
  spec.marks = {2};
  spec.marks_name = "re-placement";
  const std::string html = line_chart_html(spec);
  EXPECT_NE(html.find("data-chart=\"t\""), std::string::npos);
  EXPECT_NE(html.find("T &lt;1&gt;"), std::string::npos);
  EXPECT_NE(html.find(">loss (nats)</text>"), std::string::npos);
  EXPECT_EQ(count(html, "<polyline"), 1u);
  EXPECT_EQ(count(html, "<circle"), 2u);
  EXPECT_EQ(count(html, "class=\"ref\""), 1u);
  EXPECT_EQ(count(html, "class=\"mark\""), 1u);
  EXPECT_NE(html.find("re-placement (1)"), std::string::npos);
  // Three points on the polyline.
  const size_t p = html.find("points=\"", html.find("<polyline"));
  const size_t e = html.find('"', p + 8);
  EXPECT_EQ(count(html.substr(p, e - p), ","), 3u);
}

TEST(SvgChart, LongLinesAreThinnedButKeepTheirLastPoint) {
  LineChartSpec spec{.id = "long", .title = "long", .max_points = 100};
  ChartLine l{.name = "x"};
  for (int i = 0; i < 1000; ++i) l.x.push_back(i), l.y.push_back(i % 7);
  spec.lines.push_back(l);
  const std::string html = line_chart_html(spec);
  const size_t p = html.find("points=\"", html.find("<polyline"));
  const std::string pts = html.substr(p, html.find('"', p + 8) - p);
  EXPECT_EQ(count(pts, ","), 101u);  // every 10th, and the last
}

TEST(SvgChart, AHeatmapHasACellPerValueAndAnOutlinePerMarkedCell) {
  HeatmapSpec spec{.id = "h", .title = "load"};
  spec.value_YX = {{1, 2, 3}, {0, 0, 6}};
  spec.outlined_YX = {{0, 1, 0}, {0, 0, 1}};
  const std::string html = heatmap_html(spec);
  EXPECT_EQ(count(html, "class=\"heat\""), 6u);
  EXPECT_EQ(count(html, "class=\"res\""), 2u);
  EXPECT_NE(html.find("layer 1, expert 2: 6 rows per step, on the device"), std::string::npos);
  EXPECT_NE(html.find("fill-opacity=\"1.000\""), std::string::npos);  // the largest cell
}

}  // namespace
}  // namespace tiermoe
