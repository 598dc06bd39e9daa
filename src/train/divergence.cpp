#include "tiermoe/train/divergence.h"

#include <algorithm>
#include <cmath>

#include "tiermoe/core/error.h"

namespace tiermoe {

using detail::str_of;

namespace {

constexpr double kMeanDecay = 0.9;      // the running mean's EMA decay per step
constexpr double kMinRise = 1.0;        // nats a blow-up must add on top of the factor
constexpr double kVanishedNorm = 1e-6;  // a grad norm this small has vanished
constexpr double kChanceShare = 0.9;    // the share of ln(vocab) that counts as chance

}  // namespace

void DivergenceOptions::validate() const {
  TIERMOE_CHECK(patience >= 0, str_of("--divergence-patience ", patience, " must be >= 0"),
                "--divergence-patience", "0 turns the divergence check off");
  TIERMOE_CHECK(std::isfinite(factor) && factor > 1,
                str_of("--divergence-factor ", factor, " must be a number above 1"),
                "--divergence-factor", "the default is 2: the loss at twice its running mean");
}

DivergenceGuard::DivergenceGuard(DivergenceOptions options, int64_t vocab_size)
    : options_(options), chance_(std::log(double(std::max<int64_t>(vocab_size, 2)))) {
  options_.validate();
}

bool DivergenceGuard::update(double loss, double grad_norm) {
  const bool blowup = seen_ > 0 && loss > options_.factor * mean_ && loss > mean_ + kMinRise;
  blowup_run_ = blowup ? blowup_run_ + 1 : 0;
  if (!blowup) mean_ = seen_ == 0 ? loss : kMeanDecay * mean_ + (1 - kMeanDecay) * loss;
  ++seen_;
  const bool dead = grad_norm < kVanishedNorm && loss >= kChanceShare * chance_;
  dead_run_ = dead ? dead_run_ + 1 : 0;
  const int64_t p = options_.patience;
  return p > 0 && (blowup_run_ >= p || dead_run_ >= p);
}

void DivergenceGuard::replay(const std::vector<double>& losses) {
  for (double loss : losses) update(loss, INFINITY);
}

void DivergenceGuard::observe(int64_t step, double loss, double grad_norm) {
  if (!update(loss, grad_norm)) return;
  const std::string why =
      dead_run_ >= options_.patience
          ? str_of("the loss has stayed at chance (", loss, ", ln V = ", chance_,
                   ") with a vanished gradient (norm ", grad_norm, ") for ", dead_run_,
                   " steps in a row")
          : str_of("the loss (", loss, ") has stayed above ", options_.factor,
                   "x its running mean (", mean_, ") for ", blowup_run_, " steps in a row");
  throw Error(str_of("training diverged at step ", step, ": ", why), "--divergence-patience",
              "lower --lr (or clip with --max-grad-norm) and resume from a checkpoint written "
              "before the divergence; --divergence-patience 0 turns this check off");
}

}  // namespace tiermoe
