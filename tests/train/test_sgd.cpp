// SGD against steps written out here in f64 from torch.optim.SGD's
// documented update (the torch fixture covers f32 rounding).
#include <gtest/gtest.h>

#include <vector>

#include "common/testing.h"
#include "tiermoe/train/sgd.h"

namespace tiermoe {
namespace {

struct PlainSgd {
  SgdOptions o;
  double buf = 0;
  bool first = true;
  double step(double p, double g, double lr) {
    double d = g + o.weight_decay * p;
    if (o.momentum != 0) {
      buf = first ? d : o.momentum * buf + (1 - o.dampening) * d;
      first = false;
      d = o.nesterov ? d + o.momentum * buf : buf;
    }
    return p - lr * d;
  }
};

void check_against_plain(const SgdOptions& o) {
  const std::vector<double> init = {0.5, -1.0, 2.0};
  const std::vector<std::vector<double>> grads = {{0.3, -0.2, 0.0}, {0.1, 0.4, -1.0}, {-0.5, 0.2, 0.25}};
  const std::vector<double> lrs = {0.1, 0.05, 0.2};
  Parameter p = Parameter::create("w", {3}, DType::f64);
  for (size_t e = 0; e < init.size(); ++e) p.value.set(int64_t(e), init[e]);
  Sgd opt({p}, o);
  std::vector<PlainSgd> ref(init.size(), PlainSgd{o});
  std::vector<double> want = init;
  for (size_t s = 0; s < lrs.size(); ++s) {
    for (size_t e = 0; e < init.size(); ++e) {
      p.grad.set(int64_t(e), grads[s][e]);
      want[e] = ref[e].step(want[e], grads[s][e], lrs[s]);
    }
    opt.step(lrs[s]);
    EXPECT_TRUE(testing::all_close(p.value, Tensor::from_values({3}, DType::f64, want), 1e-14, 1e-16,
                                   "step " + std::to_string(s + 1)));
  }
}

TEST(Sgd, Plain) { check_against_plain({}); }

TEST(Sgd, MomentumDampeningWeightDecay) {
  check_against_plain({.momentum = 0.9, .dampening = 0.3, .weight_decay = 0.01});
}

TEST(Sgd, Nesterov) { check_against_plain({.momentum = 0.8, .weight_decay = 0.02, .nesterov = true}); }

TEST(Sgd, FirstMomentumStepCopiesTheGradient) {
  // torch starts the buffer at d (no dampening applied on the first step).
  Parameter p = Parameter::create("w", {2}, DType::f32);
  p.grad.set(0, 0.5);
  p.grad.set(1, -2.0);
  Sgd opt({p}, {.momentum = 0.9, .dampening = 0.5});
  opt.step(0.1);
  EXPECT_TRUE(testing::bitwise_equal(opt.momentum_buffer(0), p.grad, "momentum buffer"));
}

TEST(Sgd, RejectsNesterovWithoutMomentumOrWithDampening) {
  Parameter p = Parameter::create("w", {2}, DType::f32);
  EXPECT_THROW(Sgd({p}, {.nesterov = true}), Error);
  EXPECT_THROW(Sgd({p}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}), Error);
  EXPECT_FALSE(Sgd({p}).momentum_buffer(0).defined());
}

}  // namespace
}  // namespace tiermoe
