#pragma once
// Where a training step's wall time goes, part by part. The parts are
// disjoint: each is timed around leaf calls of the calling thread (never one
// part inside another), so they add up to the step less what no part
// covers (reported as `other`). The device tier's own busy time runs beside
// the host's and is not a part; waiting for it is.
#include <array>
#include <cstdint>
#include <string_view>

#include "tiermoe/core/timer.h"

namespace tiermoe {

enum class StepPart : uint8_t {
  data,         // drawing the micro-batches
  embedding,    // the token embedding, forward and backward
  norms,        // RMSNorms (q/k norms included), RoPE, residual adds, finite-value guards
  projections,  // q/k/v/o, dense-MLP and shared-expert products with their LoRA branches: forward,
                // dx, dW
  attention,    // the attention core (scores, softmax, P.V and their backward)
  router,       // router logits, top-k, scores and the aux loss, forward and backward
  dispatch,     // the MoE dispatch plan, gathering rows, the combine (all-to-alls with EP)
  experts,      // the experts on the host (with a device tier, the host's share)
  expert_wait,  // waiting for the device tier's experts
  lm_head,      // the final LM head and cross-entropy, forward and backward
  optimizer,    // clipping, the optimizer, re-packing updated experts, the tier between steps
};
inline constexpr size_t kNumStepParts = size_t(StepPart::optimizer) + 1;

// The part's name in --metrics and --json ("embedding", "attention", ...).
std::string_view step_part_name(StepPart p);

struct StepTimes {
  std::array<double, kNumStepParts> s{};
  double& operator[](StepPart p) { return s[size_t(p)]; }
  double operator[](StepPart p) const { return s[size_t(p)]; }
  double sum() const {
    double t = 0;
    for (double v : s) t += v;
    return t;
  }
  StepTimes since(const StepTimes& before) const {
    StepTimes d;
    for (size_t i = 0; i < kNumStepParts; ++i) d.s[i] = s[i] - before.s[i];
    return d;
  }
};

// Adds the wall time of its scope to times[part]; nothing when times is null.
class TimedPart {
 public:
  TimedPart(StepTimes* times, StepPart part) : times_(times), part_(part) {
    if (times_) t0_ = Clock::now();
  }
  ~TimedPart() {
    if (times_) (*times_)[part_] += seconds_since(t0_);
  }
  TimedPart(const TimedPart&) = delete;
  TimedPart& operator=(const TimedPart&) = delete;

 private:
  StepTimes* times_;
  StepPart part_;
  Clock::time_point t0_{};
};

// f() with its wall time added to times[part]; returns what f returns.
template <class F>
decltype(auto) timed(StepTimes* times, StepPart part, F&& f) {
  TimedPart t(times, part);
  return f();
}

}  // namespace tiermoe
