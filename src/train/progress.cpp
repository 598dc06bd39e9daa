#include "tiermoe/train/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace tiermoe {

std::string format_duration(double seconds) {
  const int64_t s = std::max<int64_t>(0, std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(s / 3600),
                  (long long)(s / 60 % 60), (long long)(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(s / 60), (long long)(s % 60));
  }
  return buf;
}

std::string format_loss(double loss, std::optional<double> floor) {
  char buf[64];
  if (floor) {
    std::snprintf(buf, sizeof buf, "%.4f (floor %.4f)", loss, *floor);
  } else {
    std::snprintf(buf, sizeof buf, "%.4f", loss);
  }
  return buf;
}

ProgressPrinter::ProgressPrinter(std::ostream& out, ProgressOptions options)
    : out_(out), options_(options) {
  if (options_.every <= 0) options_.every = std::max<int64_t>(1, options_.total_steps / 25);
}

void ProgressPrinter::update(const StepStats& s, double elapsed_s, int64_t steps_run,
                             int64_t tokens_run) {
  const bool last = s.step >= options_.total_steps;
  if (!options_.tty && !(s.step % options_.every == 0 || steps_run == 1 || last)) return;
  const double tokens_per_s = elapsed_s > 0 ? double(tokens_run) / elapsed_s : 0.0;
  const double eta =
      steps_run > 0 ? elapsed_s / double(steps_run) * double(options_.total_steps - s.step) : 0.0;
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld  loss %s  lr %.2e  |g| %.3f  %.0f tok/s  ETA %s",
                (long long)s.step, (long long)options_.total_steps,
                format_loss(s.loss, options_.loss_floor).c_str(), s.lr, s.grad_norm, tokens_per_s,
                format_duration(eta).c_str());
  if (s.tier) {
    // The device tier: the share of routed rows it computed, and its experts.
    const size_t n = std::strlen(line);
    std::snprintf(line + n, sizeof line - n, "  hot %.2f (%lld resident)",
                  s.tier->total.hot_fraction(), (long long)s.tier->resident);
  }
  if (options_.tty) {
    out_ << "\r" << line << "\x1b[K" << std::flush;  // erase what a longer line left behind
    open_line_ = true;
  } else {
    out_ << line << "\n" << std::flush;
  }
}

void ProgressPrinter::finish() {
  if (open_line_) out_ << "\n" << std::flush;
  open_line_ = false;
}

}  // namespace tiermoe
