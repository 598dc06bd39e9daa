#include "tiermoe/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "tiermoe/core/error.h"

namespace tiermoe {

LrScheduleKind parse_lr_schedule(std::string_view s) {
  if (s == "constant") return LrScheduleKind::constant;
  if (s == "cosine") return LrScheduleKind::cosine;
  throw Error(detail::str_of("unknown learning-rate schedule '", s, "'"), "--lr-schedule",
              "use constant or cosine");
}

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(options) {
  const auto& o = options_;
  TIERMOE_CHECK(std::isfinite(o.base_lr) && o.base_lr >= 0, detail::str_of("base lr ", o.base_lr),
                "learning-rate schedule", "the learning rate must be finite and >= 0");
  TIERMOE_CHECK(o.warmup_steps >= 0, detail::str_of("warmup steps ", o.warmup_steps),
                "learning-rate schedule", "warmup steps must be >= 0");
  if (o.kind == LrScheduleKind::cosine) {
    TIERMOE_CHECK(o.total_steps >= o.warmup_steps,
                  detail::str_of("total steps ", o.total_steps, " < warmup steps ", o.warmup_steps),
                  "learning-rate schedule", "the cosine decays between the warmup and the total steps");
    TIERMOE_CHECK(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1,
                  detail::str_of("min lr ratio ", o.min_lr_ratio), "learning-rate schedule",
                  "the minimum is a fraction of the base rate, in [0, 1]");
  }
}

double LrSchedule::lr(int64_t step) const {
  const auto& o = options_;
  TIERMOE_CHECK(step >= 0, detail::str_of("step ", step), "learning-rate schedule", "steps count from 0");
  if (step < o.warmup_steps) {
    return o.base_lr * (double(step) / double(std::max<int64_t>(1, o.warmup_steps)));
  }
  if (o.kind == LrScheduleKind::constant) return o.base_lr;
  double progress = double(step - o.warmup_steps) /
                    double(std::max<int64_t>(1, o.total_steps - o.warmup_steps));
  progress = std::min(progress, 1.0);
  double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * 0.5 * 2.0 * progress));
  factor = factor * (1.0 - o.min_lr_ratio) + o.min_lr_ratio;
  return o.base_lr * std::max(0.0, factor);
}

}  // namespace tiermoe
