// AdamW against steps computed here from the plain textbook formula in f64,
// bias correction at step 1, decoupled weight decay, bf16 master/working
// copies and memory accounting.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/testing.h"
#include "tiermoe/train/adamw.h"

namespace tiermoe {
namespace {

using testing::all_close;
using testing::bitwise_equal;

// The AdamW paper's Algorithm 2 with torch's lr-scaled decay, written
// independently of src/train: one scalar parameter.
struct PlainAdamW {
  double b1, b2, eps, wd;
  double m = 0, v = 0;
  int t = 0;
  double step(double p, double g, double lr) {
    ++t;
    p = p - lr * wd * p;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    double m_hat = m / (1 - std::pow(b1, t));
    double v_hat = v / (1 - std::pow(b2, t));
    return p - lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

const std::vector<double> kInitA = {0.5, -1.25, 2.0, 0.0};
const std::vector<double> kInitB = {-0.75, 3.0, 1e-3};
const std::vector<std::vector<double>> kGradsA = {
    {0.1, -0.2, 3.0, 1e-4}, {-0.05, -0.3, 2.5, 0.0}, {0.2, 0.1, -1.0, -2e-4}};
const std::vector<std::vector<double>> kGradsB = {
    {1.0, 0.0, -0.5}, {0.7, -1e-3, -0.4}, {-0.1, 2e-3, 0.6}};
const std::vector<double> kLrs = {1e-2, 5e-3, 2e-2};

std::vector<Parameter> make_params(DType dtype) {
  std::vector<Parameter> ps = {Parameter::create("a", {2, 2}, dtype), Parameter::create("b", {3}, dtype)};
  for (size_t i = 0; i < kInitA.size(); ++i) ps[0].value.set(int64_t(i), kInitA[i]);
  for (size_t i = 0; i < kInitB.size(); ++i) ps[1].value.set(int64_t(i), kInitB[i]);
  for (Parameter& p : ps) p.master.copy_from(p.value);
  return ps;
}

void set_grads(std::vector<Parameter>& ps, size_t step) {
  for (size_t i = 0; i < kGradsA[step].size(); ++i) ps[0].grad.set(int64_t(i), kGradsA[step][i]);
  for (size_t i = 0; i < kGradsB[step].size(); ++i) ps[1].grad.set(int64_t(i), kGradsB[step][i]);
}

// Runs the plain formula for every element and returns the expected values
// of parameter `which` after each step.
std::vector<std::vector<double>> plain_trajectory(const AdamWOptions& o, int which) {
  const auto& init = which == 0 ? kInitA : kInitB;
  const auto& grads = which == 0 ? kGradsA : kGradsB;
  std::vector<std::vector<double>> out(kLrs.size(), std::vector<double>(init.size()));
  for (size_t e = 0; e < init.size(); ++e) {
    PlainAdamW ref{o.beta1, o.beta2, o.eps, o.weight_decay};
    double p = init[e];
    for (size_t s = 0; s < kLrs.size(); ++s) out[s][e] = p = ref.step(p, grads[s][e], kLrs[s]);
  }
  return out;
}

void check_against_plain(const AdamWOptions& o, DType dtype, double rtol, double atol) {
  std::vector<Parameter> ps = make_params(dtype);
  AdamW opt(ps, o);
  auto want_a = plain_trajectory(o, 0), want_b = plain_trajectory(o, 1);
  for (size_t s = 0; s < kLrs.size(); ++s) {
    set_grads(ps, s);
    opt.step(kLrs[s]);
    EXPECT_TRUE(all_close(ps[0].master, Tensor::from_values({2, 2}, ps[0].master_dtype(), want_a[s]),
                          rtol, atol, "a step " + std::to_string(s + 1)));
    EXPECT_TRUE(all_close(ps[1].master, Tensor::from_values({3}, ps[1].master_dtype(), want_b[s]),
                          rtol, atol, "b step " + std::to_string(s + 1)));
    EXPECT_EQ(opt.step_count(0), int64_t(s + 1));
  }
}

TEST(AdamW, MatchesPlainFormulaWithWeightDecayF64) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  check_against_plain(o, DType::f64, 1e-13, 1e-15);
}

TEST(AdamW, MatchesPlainFormulaWithoutWeightDecayF64) {
  AdamWOptions o;
  o.weight_decay = 0.0;
  o.beta1 = 0.8;
  o.beta2 = 0.95;
  o.eps = 1e-6;
  check_against_plain(o, DType::f64, 1e-13, 1e-15);
}

TEST(AdamW, MatchesPlainFormulaF32) {
  AdamWOptions o;  // torch defaults: weight decay 0.01
  check_against_plain(o, DType::f32, 1e-6, 1e-7);
}

TEST(AdamW, FirstStepMovesByLrTimesSignOfGrad) {
  // m_hat = g and v_hat = g^2 at t = 1, so the step is lr * g / (|g| + eps).
  AdamWOptions o;
  o.weight_decay = 0.0;
  std::vector<Parameter> ps = make_params(DType::f64);
  AdamW opt(ps, o);
  set_grads(ps, 0);
  opt.step(kLrs[0]);
  for (int which = 0; which < 2; ++which) {
    const auto& init = which == 0 ? kInitA : kInitB;
    const auto& grad = which == 0 ? kGradsA[0] : kGradsB[0];
    for (size_t e = 0; e < init.size(); ++e) {
      double moved = ps[size_t(which)].value.get(int64_t(e)) - init[e];
      double want = grad[e] == 0 ? 0.0 : -kLrs[0] * (grad[e] > 0 ? 1 : -1);
      EXPECT_NEAR(moved, want, kLrs[0] * 1e-4) << ps[size_t(which)].name << "[" << e << "] g " << grad[e];
    }
  }
}

TEST(AdamW, ZeroGradOnlyDecaysAndExemptParametersDoNot) {
  AdamWOptions o;
  o.weight_decay = 0.5;
  std::vector<Parameter> ps = make_params(DType::f64);
  ps[1].weight_decay = false;
  AdamW opt(ps, o);
  opt.step(0.1);  // grads are zero: m = v = 0, the Adam term is 0 / eps = 0
  for (size_t e = 0; e < kInitA.size(); ++e) {
    EXPECT_EQ(ps[0].value.get(int64_t(e)), kInitA[e] * (1 - 0.1 * 0.5));
  }
  for (size_t e = 0; e < kInitB.size(); ++e) EXPECT_EQ(ps[1].value.get(int64_t(e)), kInitB[e]);
}

TEST(AdamW, Bf16WorkingCopiesAreRoundedF32Masters) {
  // The bf16 run's fp32 master follows exactly the f32 run (same bf16-exact
  // start, same grads), and its working copy is the RNE rounding of it.
  Rng rng(7);
  Tensor init = testing::random_tensor({257}, DType::bf16, rng);
  std::vector<Tensor> grads;
  for (int s = 0; s < 3; ++s) grads.push_back(testing::random_tensor({257}, DType::f32, rng, 0.1));
  Parameter p16 = Parameter::wrap("w", init.clone(MemTag::weights));
  Parameter p32 = Parameter::wrap("w", init.to(DType::f32, MemTag::weights));
  ASSERT_TRUE(p16.has_separate_master());
  ASSERT_FALSE(p32.has_separate_master());
  EXPECT_EQ(p16.grad.dtype(), DType::f32);
  AdamW opt16({p16}), opt32({p32});
  for (int s = 0; s < 3; ++s) {
    p16.grad.copy_from(grads[size_t(s)]);
    p32.grad.copy_from(grads[size_t(s)]);
    opt16.step(1e-2);
    opt32.step(1e-2);
    ASSERT_TRUE(bitwise_equal(p16.master, p32.value, "bf16 master vs f32 value"));
    const float* master = p16.master.data<float>();
    const bf16* working = p16.value.data<bf16>();
    for (int64_t i = 0; i < p16.numel(); ++i) {
      ASSERT_EQ(working[i].bits, float_to_bf16(master[i]).bits) << "element " << i;
    }
  }
  // The masters moved by less than a bf16 ulp in places: rounding every step
  // would have lost those updates.
  EXPECT_FALSE(bitwise_equal(p16.master, p16.value.to(DType::f32)));
}

TEST(AdamW, StatesFollowTheComputeDtype) {
  for (DType dt : {DType::bf16, DType::f32, DType::f64}) {
    AdamW opt({Parameter::create("w", {4}, dt)});
    DType want = dt == DType::f64 ? DType::f64 : DType::f32;
    EXPECT_EQ(opt.exp_avg(0).dtype(), want) << dtype_name(dt);
    EXPECT_EQ(opt.exp_avg_sq(0).dtype(), want) << dtype_name(dt);
    EXPECT_EQ(opt.params()[0].grad.dtype(), want) << dtype_name(dt);
  }
}

TEST(AdamW, MemoryIsTaggedWeightsGradsOptimizer) {
  MemoryTracker tracker;
  const int64_t n = 1000;
  {
    Parameter p = Parameter::create("w", {n}, DType::bf16, tracker);
    EXPECT_EQ(tracker.live(MemTag::weights), size_t(n * 2));
    EXPECT_EQ(tracker.live(MemTag::grads), size_t(n * 4));
    EXPECT_EQ(tracker.live(MemTag::optimizer), size_t(n * 4));  // fp32 master
    AdamW opt({p}, {}, tracker);
    EXPECT_EQ(tracker.live(MemTag::optimizer), size_t(n * 12));  // master, m, v
  }
  EXPECT_EQ(tracker.live_total(), 0u);
  Parameter p = Parameter::create("w", {n}, DType::f32, tracker);
  EXPECT_EQ(tracker.live(MemTag::weights), size_t(n * 4));
  EXPECT_EQ(tracker.live(MemTag::optimizer), 0u);  // the f32 tensor is its own master
}

TEST(AdamW, RejectsBadOptionsAndInputs) {
  AdamWOptions bad;
  bad.beta1 = 1.0;
  EXPECT_THROW(AdamW({Parameter::create("w", {2}, DType::f32)}, bad), Error);
  Parameter p = Parameter::create("w", {2}, DType::f32);
  EXPECT_THROW(AdamW({p, p}), Error);  // listed twice
  AdamW opt({p});
  EXPECT_THROW(opt.step(NAN), Error);
  EXPECT_THROW(opt.step(-1e-3), Error);
  EXPECT_THROW(Parameter::wrap("w", Tensor::zeros({2}, DType::bf16), Tensor::zeros({2}, DType::bf16)), Error);
  EXPECT_THROW(Parameter::wrap("w", Tensor::zeros({2}, DType::f32), Tensor::zeros({3}, DType::f32)), Error);
}

}  // namespace
}  // namespace tiermoe
