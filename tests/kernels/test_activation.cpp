#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>  // testing.h uses std::memcmp without including it
#include <vector>

#include "../../src/kernels/nn_common.h"
#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/kernels/activation.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

const DType kDTypes[] = {DType::f64, DType::f32, DType::bf16};

double weighted_sum(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += y.get(i) * r.get(i);
  return s;
}

}  // namespace

// cpu:: evaluates the same scalar expression per element as ref::, only split
// across threads, so the twins must agree bit for bit in every dtype.
TEST(Silu, CpuMatchesRefBitwise) {
  Rng rng(1);
  for (DType dt : kDTypes) {
    for (Shape shape : {Shape{1}, Shape{3, 7}, Shape{17, 130}, Shape{5, 4, 3}, Shape{300, 257}}) {
      Tensor x = random_tensor(shape, dt, rng, 4.0);
      Tensor dy = random_tensor(shape, dt, rng);
      Tensor y_ref = Tensor::empty(shape, dt), y_cpu = Tensor::empty(shape, dt);
      ref::silu_forward(y_ref, x);
      cpu::silu_forward(y_cpu, x);
      EXPECT_TRUE(bitwise_equal(y_cpu, y_ref, "silu y " + x.str()));
      Tensor dx_ref = random_tensor(shape, dt, rng), dx_cpu = dx_ref.clone();
      for (bool acc : {false, true}) {
        ref::silu_backward(dx_ref, dy, x, acc);
        cpu::silu_backward(dx_cpu, dy, x, acc);
        EXPECT_TRUE(bitwise_equal(dx_cpu, dx_ref, "silu dx " + x.str()));
      }
    }
  }
}

TEST(Silu, KnownValuesAndSaturation) {
  Tensor x = Tensor::from_values({5}, DType::f64, {0.0, 1.0, -1.0, 800.0, -800.0});
  Tensor y = Tensor::empty({5}, DType::f64);
  cpu::silu_forward(y, x);
  EXPECT_EQ(y.get(0), 0.0);
  EXPECT_NEAR(y.get(1), 1.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(y.get(2), -1.0 / (1.0 + std::exp(1.0)), 1e-15);
  EXPECT_EQ(y.get(3), 800.0);  // exp(-800) underflows to 0: silu(x) = x
  EXPECT_EQ(y.get(4), 0.0);    // exp(800) overflows to inf: -800 / inf = -0, not NaN
  Tensor dx = Tensor::empty({5}, DType::f64),
         dy = Tensor::from_values({5}, DType::f64, {1, 1, 1, 1, 1});
  cpu::silu_backward(dx, dy, x);
  EXPECT_EQ(dx.get(0), 0.5);
  EXPECT_EQ(dx.get(3), 1.0);
  EXPECT_EQ(dx.get(4), 0.0);
}

// The f32 exp behind SiLU (nn_common.h: exp_f32): within 2 ulp of the true
// exp over every 97th float of its range, clamped past it, NaN kept, and a
// vectorized loop over it gives the scalar bits.
TEST(ExpF32, WithinTwoUlpClampedNanKeptAndVectorLanesEqualScalar) {
  using nn_detail::exp_f32;
  double worst_ulp = 0;
  std::vector<float> xs;
  for (uint32_t bits = 0; bits < 0xFFFFFFFFu - 97; bits += 97) {
    const float x = std::bit_cast<float>(bits);
    if (!(x >= -87.33f && x <= 88.0f)) continue;
    xs.push_back(x);
    const double want = std::exp(double(x));
    const float got = exp_f32(x);
    const double ulp = double(std::nextafter(float(want), INFINITY)) - double(float(want));
    worst_ulp = std::max(worst_ulp, std::abs(double(got) - want) / ulp);
  }
  EXPECT_GT(xs.size(), 10'000'000u);
  EXPECT_LT(worst_ulp, 2.0);
  std::printf("  exp_f32: worst %.3f ulp over %zu floats\n", worst_ulp, xs.size());
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(1000.0f), exp_f32(88.0f));  // clamped: finite
  EXPECT_TRUE(std::isfinite(exp_f32(INFINITY)));
  EXPECT_EQ(exp_f32(-1000.0f), exp_f32(-87.33654f));  // clamped: the smallest normal range
  EXPECT_GT(exp_f32(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(NAN)));
  // The compiler vectorizes this loop (as it does swiglu_row); each lane must
  // be the scalar call's bits.
  std::vector<float> ys(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) ys[i] = exp_f32(xs[i]);
  for (size_t i = 0; i < xs.size(); i += 9973) {
    volatile float x = xs[i];  // a scalar call the compiler cannot fold into the loop
    ASSERT_EQ(std::bit_cast<uint32_t>(ys[i]), std::bit_cast<uint32_t>(exp_f32(x))) << xs[i];
  }
}

// In f32 SiLU saturates without inf: silu(-800) is a tiny negative number,
// silu(800) is 800, and NaN stays NaN (the non-finite guards rely on it).
TEST(Silu, F32SaturatesFiniteAndKeepsNan) {
  Tensor x = Tensor::from_values({4}, DType::f32, {800.0, -800.0, NAN, 1.0});
  Tensor y = Tensor::empty({4}, DType::f32);
  cpu::silu_forward(y, x);
  EXPECT_EQ(y.get(0), 800.0);
  EXPECT_LE(y.get(1), 0.0);
  EXPECT_GT(y.get(1), -1e-30);
  EXPECT_TRUE(std::isnan(y.get(2)));
  EXPECT_NEAR(y.get(3), 1.0 / (1.0 + std::exp(-1.0)), 2e-7);
}

TEST(Silu, BackwardMatchesFiniteDifferences) {
  Rng rng(2);
  Tensor x = random_tensor({4, 9}, DType::f64, rng, 2.0);
  Tensor r = random_tensor({4, 9}, DType::f64, rng);
  Tensor y = Tensor::empty({4, 9}, DType::f64), dx = Tensor::empty({4, 9}, DType::f64);
  auto loss = [&] {
    cpu::silu_forward(y, x);
    return weighted_sum(y, r);
  };
  cpu::silu_backward(dx, r, x);
  EXPECT_TRUE(fd_check(loss, x, dx, "silu dx"));
}

TEST(Swiglu, CpuMatchesRefBitwise) {
  Rng rng(3);
  for (DType dt : kDTypes) {
    for (auto [N, F] : {std::pair{1, 1}, {3, 7}, {17, 64}, {5, 130}, {64, 200}}) {
      Tensor h = random_tensor({N, 2 * F}, dt, rng, 3.0);
      Tensor da = random_tensor({N, F}, dt, rng);
      Tensor a_ref = Tensor::empty({N, F}, dt), a_cpu = Tensor::empty({N, F}, dt);
      ref::swiglu_forward(a_ref, h);
      cpu::swiglu_forward(a_cpu, h);
      EXPECT_TRUE(bitwise_equal(a_cpu, a_ref, "swiglu a " + h.str()));
      Tensor dh_ref = random_tensor({N, 2 * F}, dt, rng), dh_cpu = dh_ref.clone();
      for (bool acc : {false, true}) {
        ref::swiglu_backward(dh_ref, da, h, acc);
        cpu::swiglu_backward(dh_cpu, da, h, acc);
        EXPECT_TRUE(bitwise_equal(dh_cpu, dh_ref, "swiglu dh " + h.str()));
      }
    }
  }
}

TEST(Swiglu, GateThenUpLayout) {
  // One row, F = 2: gate = (1, -2), up = (3, 5).
  Tensor h = Tensor::from_values({1, 4}, DType::f64, {1, -2, 3, 5});
  Tensor a = Tensor::empty({1, 2}, DType::f64);
  cpu::swiglu_forward(a, h);
  EXPECT_NEAR(a.get(0), 3.0 / (1.0 + std::exp(-1.0)), 1e-15);
  EXPECT_NEAR(a.get(1), 5.0 * -2.0 / (1.0 + std::exp(2.0)), 1e-15);
}

TEST(Swiglu, BackwardMatchesFiniteDifferencesAndAccumulates) {
  Rng rng(4);
  Tensor h = random_tensor({5, 14}, DType::f64, rng, 2.0);
  Tensor r = random_tensor({5, 7}, DType::f64, rng);
  Tensor a = Tensor::empty({5, 7}, DType::f64);
  auto loss = [&] {
    ref::swiglu_forward(a, h);
    return weighted_sum(a, r);
  };
  for (bool use_cpu : {false, true}) {
    Tensor dh = Tensor::empty({5, 14}, DType::f64);
    use_cpu ? cpu::swiglu_backward(dh, r, h) : ref::swiglu_backward(dh, r, h);
    EXPECT_TRUE(fd_check(loss, h, dh, use_cpu ? "cpu swiglu dh" : "ref swiglu dh"));
    // accumulate adds the same gradient again: 2x.
    Tensor twice = dh.clone();
    use_cpu ? cpu::swiglu_backward(twice, r, h, true) : ref::swiglu_backward(twice, r, h, true);
    for (int64_t i = 0; i < dh.numel(); ++i) EXPECT_EQ(twice.get(i), 2 * dh.get(i));
  }
}

TEST(Swiglu, RejectsBadShapesAndDtypes) {
  Tensor h = Tensor::zeros({3, 8}, DType::f32);
  Tensor a_bad = Tensor::zeros({3, 3}, DType::f32);
  EXPECT_THROW(cpu::swiglu_forward(a_bad, h), Error);
  EXPECT_THROW(ref::swiglu_forward(a_bad, h), Error);
  Tensor a_bf16 = Tensor::zeros({3, 4}, DType::bf16);
  EXPECT_THROW(cpu::swiglu_forward(a_bf16, h), Error);
  Tensor odd = Tensor::zeros({3, 7}, DType::f32), a = Tensor::zeros({3, 3}, DType::f32);
  EXPECT_THROW(cpu::swiglu_forward(a, odd), Error);
  Tensor x = Tensor::zeros({4}, DType::f32), y = Tensor::zeros({5}, DType::f32);
  EXPECT_THROW(cpu::silu_forward(y, x), Error);
  Tensor undefined;
  EXPECT_THROW(ref::silu_forward(undefined, x), Error);
}

// The output gate y = x * sigmoid(g): cpu:: is ref::'s expression per
// element, bitwise in every dtype; both gradients by finite differences.
TEST(SigmoidGate, CpuMatchesRefBitwiseAndFiniteDifferences) {
  Rng rng(5);
  for (DType dt : kDTypes) {
    for (Shape shape : {Shape{1}, Shape{3, 7}, Shape{300, 257}}) {
      Tensor x = random_tensor(shape, dt, rng, 2.0), g = random_tensor(shape, dt, rng, 4.0);
      Tensor dy = random_tensor(shape, dt, rng);
      Tensor y_ref = Tensor::empty(shape, dt), y_cpu = Tensor::empty(shape, dt);
      ref::sigmoid_gate_forward(y_ref, x, g);
      cpu::sigmoid_gate_forward(y_cpu, x, g);
      EXPECT_TRUE(bitwise_equal(y_cpu, y_ref, "gate y " + x.str()));
      Tensor dx_ref = Tensor::empty(shape, dt), dg_ref = Tensor::empty(shape, dt);
      Tensor dx_cpu = Tensor::empty(shape, dt), dg_cpu = Tensor::empty(shape, dt);
      ref::sigmoid_gate_backward(dx_ref, dg_ref, dy, x, g);
      cpu::sigmoid_gate_backward(dx_cpu, dg_cpu, dy, x, g);
      EXPECT_TRUE(bitwise_equal(dx_cpu, dx_ref, "gate dx " + x.str()));
      EXPECT_TRUE(bitwise_equal(dg_cpu, dg_ref, "gate dg " + x.str()));
    }
  }
  Tensor x = random_tensor({4, 9}, DType::f64, rng, 2.0);
  Tensor g = random_tensor({4, 9}, DType::f64, rng, 3.0);
  Tensor r = random_tensor({4, 9}, DType::f64, rng);
  Tensor y = Tensor::empty({4, 9}, DType::f64);
  Tensor dx = Tensor::empty({4, 9}, DType::f64), dg = Tensor::empty({4, 9}, DType::f64);
  auto loss = [&] {
    ref::sigmoid_gate_forward(y, x, g);
    return weighted_sum(y, r);
  };
  cpu::sigmoid_gate_backward(dx, dg, r, x, g);
  EXPECT_TRUE(fd_check(loss, x, dx, "gate dx"));
  EXPECT_TRUE(fd_check(loss, g, dg, "gate dg"));
  EXPECT_NEAR(y.get(0), x.get(0) / (1 + std::exp(-g.get(0))), 1e-15);
  // A gate of another shape, or a gradient of another dtype, is refused by name.
  Tensor g_bad = Tensor::zeros({4, 8}, DType::f64), dg_bad = Tensor::zeros({4, 9}, DType::f32);
  EXPECT_TRUE(throws_error_with([&] { cpu::sigmoid_gate_forward(y, x, g_bad); },
                                {"sigmoid_gate_forward", "g"}));
  EXPECT_TRUE(throws_error_with([&] { ref::sigmoid_gate_backward(dx, dg_bad, r, x, g); },
                                {"sigmoid_gate_backward", "dg"}));
}
