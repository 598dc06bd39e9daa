#pragma once
// Learning-rate schedules with Hugging Face semantics. lr(step) is the rate
// of the optimizer update with 0-based index `step`: HF's LambdaLR is stepped
// after optimizer.step(), so the first update uses lambda(0), which is 0 when
// there is a warmup.
//
//   warmup:  lr = base * step / max(1, warmup)                    step < warmup
//   cosine:  progress = (step - warmup) / max(1, total - warmup)
//            f = 0.5 * (1 + cos(pi * progress))                   (num_cycles 0.5)
//            lr = base * (f * (1 - min_ratio) + min_ratio)
//   constant: lr = base after warmup
// min_ratio = 0 is get_cosine_schedule_with_warmup; min_ratio > 0 is
// get_cosine_with_min_lr_schedule_with_warmup(min_lr_rate). Past `total`
// steps the cosine holds at base * min_ratio (HF's would turn back up).
#include <cstdint>
#include <string_view>

namespace tiermoe {

enum class LrScheduleKind { constant, cosine };
LrScheduleKind parse_lr_schedule(std::string_view s);  // "constant" | "cosine"

struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::cosine;
  double base_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;   // cosine only: the step at which lr reaches its minimum
  double min_lr_ratio = 0.0; // cosine only, in [0, 1]
};

class LrSchedule {
 public:
  explicit LrSchedule(LrScheduleOptions options);  // throws Error on bad options
  double lr(int64_t step) const;
  const LrScheduleOptions& options() const { return options_; }

 private:
  LrScheduleOptions options_;
};

}  // namespace tiermoe
