#pragma once
// AdamW as torch.optim.AdamW (amsgrad=False, maximize=False, the
// single-tensor path), per parameter with step count t:
//   p  *= 1 - lr*wd                      (decoupled weight decay)
//   m   = b1*m + (1-b1)*g
//   v   = b2*v + (1-b2)*g*g
//   p  -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// States m and v are in the master dtype (fp32; f64 in f64 runs).
//
// Rounding follows PyTorch 1.13's CPU kernels operation by operation so an
// fp32 step matches torch bitwise (tests/data/optim holds torch's numbers):
// scalars (1-lr*wd, lr/(1-b1^t), sqrt(1-b2^t)) are computed in double as
// Python does, then rounded to the master dtype; m = fma(g, 1-b1, m*b1)
// (torch's add_ with alpha is an FMA); v = fma((1-b2)*g, g, v*b2) (its
// addcmul_, contracted to an FMA in the AVX2 build); then
// p + (-step_size*m) / (sqrt(v)/sqrt(1-b2^t) + eps). torch >= 2.0 writes the
// first moment as lerp_, which can differ from this in the last bit of m.
#include <vector>

#include "tiermoe/train/optimizer.h"

namespace tiermoe {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // skipped for parameters with weight_decay == false
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<Parameter> params, AdamWOptions options = {},
        MemoryTracker& tracker = MemoryTracker::process());

  void step(double lr) override;
  OptimizerState state_tensors() const override;   // "<p>.exp_avg", "<p>.exp_avg_sq", "<p>.step"[, "<p>.master"]
  void load_state(const OptimizerState& state) override;

  const AdamWOptions& options() const { return options_; }
  const Tensor& exp_avg(size_t i) const { return exp_avg_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return exp_avg_sq_.at(i); }

 private:
  AdamWOptions options_;
  std::vector<Tensor> exp_avg_;     // m, master dtype, tag optimizer
  std::vector<Tensor> exp_avg_sq_;  // v, master dtype, tag optimizer
};

}  // namespace tiermoe
