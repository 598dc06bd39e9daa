#include "tiermoe/core/progress_meter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tiermoe/core/timer.h"

namespace tiermoe {

namespace {

// "1:05" / "1:02:03".
std::string clock_time(double seconds) {
  const long long s = std::max(0LL, std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  }
  return buf;
}

// Bytes in decimal units with 3 significant digits ("12.3 GB"); counts as integers.
std::string amount(double v, const std::string& unit) {
  char buf[48];
  if (unit != "bytes") {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  static const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  std::snprintf(buf, sizeof buf,
                u == 0     ? "%.0f %s"
                : v >= 100 ? "%.0f %s"
                : v >= 10  ? "%.1f %s"
                           : "%.2f %s",
                v, units[u]);
  return buf;
}

}  // namespace

ProgressMeter::ProgressMeter(ProgressSink sink, std::string what, double total,
                             ProgressMeterOptions options)
    : sink_(sink),
      what_(std::move(what)),
      total_(std::max(total, 1e-300)),
      options_(std::move(options)) {
  start_s_ = now();
}

ProgressMeter::~ProgressMeter() {
  if (open_line_ && sink_.out) *sink_.out << "\n" << std::flush;
}

double ProgressMeter::now() const {
  if (options_.clock) return options_.clock();
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

std::string ProgressMeter::status(double done, double elapsed_s) const {
  const double frac = std::clamp(done / total_, 0.0, 1.0);
  std::string s = std::to_string(int(std::floor(frac * 100))) + "% (" +
                  amount(done, options_.unit) + " of " + amount(total_, options_.unit) +
                  (options_.unit == "bytes" ? "" : " " + options_.unit) + ")";
  if (elapsed_s > 0 && done > 0) {
    const double rate = done / elapsed_s;
    if (options_.unit == "bytes") s += ", " + amount(rate, "bytes") + "/s";
    s += ", ETA " + clock_time((total_ - std::min(done, total_)) / rate);
  }
  return s;
}

void ProgressMeter::print(const std::string& text) {
  if (sink_.tty) {
    *sink_.out << "\r" << what_ << ": " << text << "\x1b[K" << std::flush;
    open_line_ = true;
  } else {
    *sink_.out << what_ << ": " << text << "\n" << std::flush;
  }
}

void ProgressMeter::update(double done) {
  done_ = done;
  if (!sink_.out || finished_) return;
  const double t = now(), elapsed = t - start_s_;
  if (elapsed < options_.delay_s) return;
  const bool due = sink_.tty
                       ? last_print_s_ < 0 || t - last_print_s_ >= options_.tty_interval_s
                       : last_print_s_ < 0 || t - last_print_s_ >= options_.quiet_interval_s ||
                             (done - last_print_done_) / total_ >= options_.quiet_fraction;
  if (!due) return;
  print(status(done, elapsed));
  last_print_s_ = t;
  last_print_done_ = done;
}

void ProgressMeter::finish() {
  if (finished_) return;
  finished_ = true;
  if (!sink_.out || last_print_s_ < 0) return;
  print("done, " + amount(done_, options_.unit) +
        (options_.unit == "bytes" ? "" : " " + options_.unit) + " in " +
        clock_time(now() - start_s_));
  if (open_line_) *sink_.out << "\n" << std::flush;
  open_line_ = false;
}

}  // namespace tiermoe
