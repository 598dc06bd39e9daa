#include "tiermoe/report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace tiermoe {

namespace {

// A line's CSS class: one of the eight colours.
std::string line_class(const ChartLine& l) {
  std::string c = "c";
  c += std::to_string(l.color % 8);
  return c;
}

// The plot's box inside the SVG (px).
constexpr double kWidth = 760, kHeight = 280;
constexpr double kLeft = 76, kRight = 18, kTop = 14, kBottom = 46;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A number with at most 3 significant digits and no trailing zeros.
std::string short_number(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a < 1e-3) return fmt("%.2g", v);
  std::string s = fmt(a >= 100 ? "%.0f" : a >= 10 ? "%.1f" : a >= 1 ? "%.2f" : "%.3f", v);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

// Bytes are ticked in the binary unit their range calls for.
double bytes_scale(double hi) {
  double scale = 1;
  while (hi / scale >= 1024 && scale < std::pow(1024.0, 4)) scale *= 1024;
  return scale;
}

double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

struct Scale {
  double lo, hi, px_lo, px_hi;
  double operator()(double v) const {
    return hi > lo ? px_lo + (v - lo) / (hi - lo) * (px_hi - px_lo) : (px_lo + px_hi) / 2;
  }
};

// The indices a line is drawn through: all, or every n-th and the last.
std::vector<size_t> drawn_indices(size_t n, int max_points) {
  const size_t stride =
      n > size_t(max_points) ? (n + size_t(max_points) - 1) / size_t(max_points) : 1;
  std::vector<size_t> idx;
  for (size_t i = 0; i < n; i += stride) idx.push_back(i);
  if (n > 0 && idx.back() != n - 1) idx.push_back(n - 1);
  return idx;
}

std::string point(const Scale& sx, const Scale& sy, double x, double y) {
  return fmt("%.1f", sx(x)) + "," + fmt("%.1f", sy(y)) + " ";
}

std::string line_points(const ChartLine& l, const Scale& sx, const Scale& sy, int max_points) {
  std::string s;
  for (size_t i : drawn_indices(std::min(l.x.size(), l.y.size()), max_points)) {
    s += point(sx, sy, l.x[i], l.y[i]);
  }
  return s;
}

// A stacked area: along its top (floor + value), then back along its floor.
std::string area_points(const ChartLine& l, const std::vector<double>& floor, const Scale& sx,
                        const Scale& sy, int max_points) {
  const std::vector<size_t> idx = drawn_indices(std::min(l.x.size(), l.y.size()), max_points);
  std::string s;
  for (size_t i : idx) s += point(sx, sy, l.x[i], floor[i] + l.y[i]);
  for (auto it = idx.rbegin(); it != idx.rend(); ++it) s += point(sx, sy, l.x[*it], floor[*it]);
  return s;
}

std::string legend_item(const std::string& cls, const std::string& name) {
  return "<li><span class=\"sw " + cls + "\"></span>" + html_escape(name) + "</li>";
}

std::string figure_open(const std::string& id, const std::string& title, const std::string& note) {
  std::string s = "<figure class=\"chart\" data-chart=\"" + html_escape(id) + "\" id=\"chart-" +
                  html_escape(id) + "\"><figcaption>" + html_escape(title) + "</figcaption>";
  if (!note.empty()) s += "<p class=\"note\">" + html_escape(note) + "</p>";
  return s;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target, ValueKind kind) {
  if (!(hi > lo)) hi = lo + (lo == 0 ? 1 : std::fabs(lo) * 0.1);
  double step;
  if (kind == ValueKind::bytes) {
    // Powers of two in the unit below the range's, so that ticks read
    // 256 MiB, 512 MiB, 768 MiB, 1 GiB.
    double scale = bytes_scale(hi);
    if (hi / scale < 4 && scale > 1) scale /= 1024;
    step = std::exp2(std::ceil(std::log2((hi - lo) / scale / std::max(1, target)))) * scale;
  } else {
    step = nice_step((hi - lo) / std::max(1, target));
  }
  // Ticks as k * step, or k / (1/step) for fractions, so that 1.7 is 1.7.
  const double inv = step < 1 ? std::round(1 / step) : 0;
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
    ticks.push_back(k == 0 ? 0.0 : inv > 0 ? k / inv : k * step);
  }
  return ticks;
}

std::string format_value(double v, ValueKind kind) {
  const double a = std::fabs(v);
  switch (kind) {
    case ValueKind::seconds:
      if (a == 0) return "0 s";
      if (a < 1e-3) return short_number(v * 1e6) + " µs";
      if (a < 1) return short_number(v * 1e3) + " ms";
      return short_number(v) + " s";
    case ValueKind::bytes: {
      static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
      const double scale = bytes_scale(a);
      return short_number(v / scale) + " " + units[int(std::lround(std::log2(scale) / 10))];
    }
    case ValueKind::fraction:
      return short_number(v);
    case ValueKind::plain:
      if (a >= 1e9) return short_number(v / 1e9) + "G";
      if (a >= 1e6) return short_number(v / 1e6) + "M";
      if (a >= 1e4) return short_number(v / 1e3) + "k";
      return short_number(v);
  }
  return short_number(v);
}

std::string line_chart_html(const LineChartSpec& spec) {
  // The data's extent; stacked areas reach their sums.
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  std::vector<std::vector<double>> bases;  // stacked: each area's floor
  std::vector<double> sum;
  for (const ChartLine& l : spec.lines) {
    const size_t n = std::min(l.x.size(), l.y.size());
    if (spec.stacked) {
      if (sum.size() < n) sum.resize(n, 0.0);
      bases.push_back(sum);
    }
    for (size_t i = 0; i < n; ++i) {
      const double y = spec.stacked ? sum[i] + l.y[i] : l.y[i];
      if (!std::isfinite(l.x[i]) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, l.x[i]);
      x_hi = std::max(x_hi, l.x[i]);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
      if (spec.stacked) sum[i] += l.y[i];
    }
  }
  for (const RefLine& r : spec.refs) {
    y_lo = std::min(y_lo, r.y);
    y_hi = std::max(y_hi, r.y);
  }
  for (double m : spec.marks) {
    x_lo = std::min(x_lo, m);
    x_hi = std::max(x_hi, m);
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1;
  if (spec.x_min) x_lo = std::min(x_lo, *spec.x_min);
  if (!std::isfinite(y_lo)) y_lo = 0, y_hi = 1;
  if (spec.y_min) {
    y_lo = *spec.y_min;
  } else if (y_lo >= 0 && y_lo <= 0.6 * y_hi) {
    y_lo = 0;  // positive quantities start at zero unless that flattens them
  }
  if (spec.y_max) y_hi = *spec.y_max;
  if (!(y_hi > y_lo)) y_hi = y_lo + (y_lo == 0 ? 1 : std::fabs(y_lo) * 0.1);
  // Head room, and the y axis ends on a tick (so its top reads off).
  if (!spec.y_max) y_hi += (y_hi - y_lo) * 0.05;
  std::vector<double> yt = nice_ticks(y_lo, y_hi, 5, spec.y_kind);
  if (!spec.y_max && yt.size() >= 2 && yt.back() < y_hi) {
    yt.push_back(yt.back() + (yt[1] - yt[0]));
    y_hi = yt.back();
  }
  const std::vector<double> xt = nice_ticks(x_lo, x_hi, 7);
  const Scale sx{x_lo, x_hi, kLeft, kWidth - kRight};
  const Scale sy{y_lo, y_hi, kHeight - kBottom, kTop};

  std::ostringstream os;
  os << figure_open(spec.id, spec.title, spec.note);
  os << "<svg viewBox=\"0 0 " << kWidth << " " << kHeight << "\" role=\"img\" aria-label=\""
     << html_escape(spec.title) << "\">";
  for (double t : yt) {
    const double y = sy(t);
    os << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kWidth - kRight << "\" y1=\""
       << fmt("%.1f", y) << "\" y2=\"" << fmt("%.1f", y) << "\"/>";
    os << "<text class=\"tick\" x=\"" << kLeft - 6 << "\" y=\"" << fmt("%.1f", y + 4)
       << "\" text-anchor=\"end\">" << html_escape(format_value(t, spec.y_kind)) << "</text>";
  }
  for (double t : xt) {
    const double x = sx(t);
    os << "<line class=\"axis\" x1=\"" << fmt("%.1f", x) << "\" x2=\"" << fmt("%.1f", x)
       << "\" y1=\"" << kHeight - kBottom << "\" y2=\"" << kHeight - kBottom + 5 << "\"/>";
    os << "<text class=\"tick\" x=\"" << fmt("%.1f", x) << "\" y=\"" << kHeight - kBottom + 18
       << "\" text-anchor=\"middle\">" << html_escape(format_value(t, ValueKind::plain))
       << "</text>";
  }
  os << "<line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kWidth - kRight << "\" y1=\""
     << kHeight - kBottom << "\" y2=\"" << kHeight - kBottom << "\"/>";
  os << "<line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kLeft << "\" y1=\"" << kTop
     << "\" y2=\"" << kHeight - kBottom << "\"/>";
  os << "<text class=\"label\" x=\"" << (kLeft + kWidth - kRight) / 2 << "\" y=\"" << kHeight - 8
     << "\" text-anchor=\"middle\">" << html_escape(spec.x_label) << "</text>";
  os << "<text class=\"label\" transform=\"translate(16," << (kTop + kHeight - kBottom) / 2
     << ") rotate(-90)\" text-anchor=\"middle\">" << html_escape(spec.y_label) << "</text>";

  for (size_t k = 0; k < spec.lines.size(); ++k) {
    const ChartLine& l = spec.lines[k];
    const std::string cls = line_class(l);
    if (spec.stacked) {
      os << "<polygon class=\"area " << cls << "\" points=\""
         << area_points(l, bases[k], sx, sy, spec.max_points) << "\"/>";
    } else if (l.dots) {
      for (size_t i = 0; i < std::min(l.x.size(), l.y.size()); ++i) {
        os << "<circle class=\"dot " << cls << "\" cx=\"" << fmt("%.1f", sx(l.x[i])) << "\" cy=\""
           << fmt("%.1f", sy(l.y[i])) << "\" r=\"3.5\"/>";
      }
    } else {
      os << "<polyline class=\"ln " << cls << (l.dashed ? " dash" : "") << "\" points=\""
         << line_points(l, sx, sy, spec.max_points) << "\"/>";
    }
  }
  for (const RefLine& r : spec.refs) {
    os << "<line class=\"ref\" x1=\"" << kLeft << "\" x2=\"" << kWidth - kRight << "\" y1=\""
       << fmt("%.1f", sy(r.y)) << "\" y2=\"" << fmt("%.1f", sy(r.y)) << "\"/>";
  }
  for (double m : spec.marks) {
    os << "<line class=\"mark\" x1=\"" << fmt("%.1f", sx(m)) << "\" x2=\"" << fmt("%.1f", sx(m))
       << "\" y1=\"" << kTop << "\" y2=\"" << kHeight - kBottom << "\"/>";
  }
  os << "</svg><ul class=\"legend\">";
  for (const ChartLine& l : spec.lines) {
    const std::string cls = line_class(l);
    const std::string kind = spec.stacked ? "area " : l.dots ? "dot " : "ln ";
    const std::string last =
        spec.legend_last && !l.y.empty() ? " (" + format_value(l.y.back(), spec.y_kind) + ")" : "";
    os << legend_item(kind + cls + (l.dashed ? " dash" : ""), l.name + last);
  }
  for (const RefLine& r : spec.refs) {
    os << legend_item("ref", r.name + " (" + format_value(r.y, spec.y_kind) + ")");
  }
  if (!spec.marks.empty()) {
    os << legend_item("mark", spec.marks_name + " (" + std::to_string(spec.marks.size()) + ")");
  }
  os << "</ul></figure>\n";
  return os.str();
}

std::string heatmap_html(const HeatmapSpec& spec) {
  const size_t rows = spec.value_YX.size();
  size_t cols = 0;
  double hi = 0;
  for (const auto& r : spec.value_YX) {
    cols = std::max(cols, r.size());
    for (double v : r) hi = std::max(hi, v);
  }
  // Cells as large as fit 700 px across, a readable height down.
  const double cw = cols ? std::clamp(680.0 / double(cols), 3.0, 72.0) : 10;
  const double ch = rows ? std::clamp(420.0 / double(rows), 4.0, 36.0) : 10;
  const double left = 64, top = 10, bottom = 44;
  const double width = left + cw * double(cols) + 16, height = top + ch * double(rows) + bottom;

  std::ostringstream os;
  os << figure_open(spec.id, spec.title, spec.note);
  os << "<svg viewBox=\"0 0 " << fmt("%.0f", width) << " " << fmt("%.0f", height)
     << "\" style=\"max-width:" << fmt("%.0f", width) << "px\" role=\"img\" aria-label=\""
     << html_escape(spec.title) << "\">";
  for (size_t y = 0; y < rows; ++y) {
    for (size_t x = 0; x < spec.value_YX[y].size(); ++x) {
      const double v = spec.value_YX[y][x];
      // A floor of opacity so that an idle expert still shows as a cell.
      const double a = hi > 0 ? 0.06 + 0.94 * v / hi : 0.06;
      os << "<rect class=\"heat\" x=\"" << fmt("%.1f", left + cw * double(x)) << "\" y=\""
         << fmt("%.1f", top + ch * double(y)) << "\" width=\"" << fmt("%.2f", cw) << "\" height=\""
         << fmt("%.2f", ch) << "\" fill-opacity=\"" << fmt("%.3f", a) << "\"><title>layer " << y
         << ", expert " << x << ": " << html_escape(short_number(v)) << " "
         << html_escape(spec.value_label)
         << (y < spec.outlined_YX.size() && x < spec.outlined_YX[y].size() && spec.outlined_YX[y][x]
                 ? ", " + html_escape(spec.outlined_name)
                 : "")
         << "</title></rect>";
    }
  }
  // Outlines over the cells, inset so neighbours' outlines do not merge.
  for (size_t y = 0; y < std::min(rows, spec.outlined_YX.size()); ++y) {
    for (size_t x = 0; x < spec.outlined_YX[y].size(); ++x) {
      if (!spec.outlined_YX[y][x]) continue;
      os << "<rect class=\"res\" x=\"" << fmt("%.1f", left + cw * double(x) + 1) << "\" y=\""
         << fmt("%.1f", top + ch * double(y) + 1) << "\" width=\"" << fmt("%.2f", cw - 2)
         << "\" height=\"" << fmt("%.2f", ch - 2) << "\"/>";
    }
  }
  // Axis ticks: every layer when they fit, else a nice step.
  const auto step_for = [](double px) {
    size_t s = 1;
    while (double(s) * px < 22) s = s < 2 ? 2 : s < 5 ? 5 : s < 10 ? 10 : s * 2;
    return s;
  };
  for (size_t y = 0, s = step_for(ch); y < rows; y += s) {
    os << "<text class=\"tick\" x=\"" << left - 6 << "\" y=\""
       << fmt("%.1f", top + ch * (double(y) + 0.5) + 4) << "\" text-anchor=\"end\">" << y
       << "</text>";
  }
  for (size_t x = 0, s = step_for(cw); x < cols; x += s) {
    os << "<text class=\"tick\" x=\"" << fmt("%.1f", left + cw * (double(x) + 0.5)) << "\" y=\""
       << fmt("%.1f", top + ch * double(rows) + 16) << "\" text-anchor=\"middle\">" << x
       << "</text>";
  }
  os << "<text class=\"label\" x=\"" << fmt("%.1f", left + cw * double(cols) / 2) << "\" y=\""
     << fmt("%.1f", height - 6) << "\" text-anchor=\"middle\">" << html_escape(spec.x_label)
     << "</text>";
  os << "<text class=\"label\" transform=\"translate(16,"
     << fmt("%.1f", top + ch * double(rows) / 2) << ") rotate(-90)\" text-anchor=\"middle\">"
     << html_escape(spec.y_label) << "</text>";
  os << "</svg><ul class=\"legend\">";
  os << "<li><span class=\"ramp\"></span>" << html_escape(spec.value_label) << ": 0 to "
     << html_escape(short_number(hi)) << "</li>";
  os << legend_item("res", spec.outlined_name);
  os << "</ul></figure>\n";
  return os.str();
}

}  // namespace tiermoe
