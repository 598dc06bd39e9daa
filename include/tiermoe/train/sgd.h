#pragma once
// SGD as torch.optim.SGD (maximize=False, the single-tensor path):
//   d = g + wd*p
//   with momentum: buf = d on the first step, else buf = momentum*buf + (1-dampening)*d;
//                  d = nesterov ? d + momentum*buf : buf
//   p -= lr*d
// The momentum buffer is in the master dtype. Each `x + alpha*y` is one fused
// multiply-add, as torch's vectorised add_ with alpha computes it.
#include <vector>

#include "tiermoe/train/optimizer.h"

namespace tiermoe {

struct SgdOptions {
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  // coupled (added to the gradient), as torch.optim.SGD
  bool nesterov = false;      // needs momentum > 0 and dampening == 0
};

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<Parameter> params, SgdOptions options = {},
      MemoryTracker& tracker = MemoryTracker::process());

  void step(double lr) override;
  OptimizerState state_tensors() const override;  // "<p>.step"[, "<p>.momentum_buffer"][, "<p>.master"]
  void load_state(const OptimizerState& state) override;

  const SgdOptions& options() const { return options_; }
  // Undefined without momentum.
  const Tensor& momentum_buffer(size_t i) const { return momentum_buffer_.at(i); }

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_buffer_;
};

}  // namespace tiermoe
