#include <gtest/gtest.h>

#include <cstring>  // testing.h uses std::memcmp without including it

#include "common/testing.h"
#include "tiermoe/kernels/softmax.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

double weighted_sum(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += y.get(i) * r.get(i);
  return s;
}

// cpu:: sums a row in vectorized order, ref:: left to right. Both sums are of
// positive terms, so they differ by a few ulps of the accumulation type
// (f64: 1e-12 is ~4500 ulps of slack; f32: 1e-5 ~ 80 ulps). A bf16 output is
// rounded once from values that differ by that much, so it may land one bf16
// ulp apart: up to 2^-7 relative at the bottom of a binade.
double rtol_for(DType out) {
  switch (out) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::bf16:
      return 1.0 / 128;
  }
  return 0;
}

struct Case {
  DType in, out;
};
const Case kCases[] = {{DType::f64, DType::f64},
                       {DType::f32, DType::f32},
                       {DType::bf16, DType::bf16},
                       {DType::bf16, DType::f32}};

}  // namespace

TEST(Softmax, CpuMatchesRef) {
  Rng rng(11);
  for (Case c : kCases) {
    for (Shape shape : {Shape{1, 1}, Shape{1, 7}, Shape{3, 64}, Shape{17, 130}, Shape{2, 3, 5},
                        Shape{40, 1000}}) {
      Tensor x = random_tensor(shape, c.in, rng, 3.0);
      Tensor y_ref = Tensor::empty(shape, c.out), y_cpu = Tensor::empty(shape, c.out);
      ref::softmax_forward(y_ref, x);
      cpu::softmax_forward(y_cpu, x);
      double rtol = rtol_for(c.out);
      EXPECT_TRUE(all_close(y_cpu, y_ref, rtol, 0, "softmax y " + x.str() + "->" + y_ref.str()));

      Tensor dy = random_tensor(shape, c.out, rng);
      Tensor dx_ref = random_tensor(shape, c.in, rng), dx_cpu = dx_ref.clone();
      for (bool acc : {false, true}) {
        ref::softmax_backward(dx_ref, dy, y_ref, acc);
        cpu::softmax_backward(dx_cpu, dy, y_ref, acc);
        // dx = y * (dy - dot): cancellation in (dy - dot) makes the relative
        // error unbounded near zero, so an absolute floor scaled like rtol.
        double tol = std::max(rtol_for(c.in), rtol);
        EXPECT_TRUE(all_close(dx_cpu, dx_ref, tol, tol, "softmax dx " + dx_ref.str()));
      }
    }
  }
}

TEST(Softmax, RowsSumToOneAndAreShiftInvariant) {
  Tensor x = Tensor::from_values({2, 3}, DType::f64, {1, 2, 3, 1001, 1002, 1003});
  Tensor y = Tensor::empty({2, 3}, DType::f64);
  cpu::softmax_forward(y, x);
  double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0);
  EXPECT_NEAR(y.get(0), e1 / (e1 + e2 + e3), 1e-15);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(y.get(3 + i), y.get(i), 1e-15);  // no overflow at 1000
}

TEST(Softmax, NegativeInfinityGetsZeroProbability) {
  Tensor x = Tensor::from_values({1, 3}, DType::f32, {0, -INFINITY, 0});
  Tensor y = Tensor::empty({1, 3}, DType::f32);
  cpu::softmax_forward(y, x);
  EXPECT_EQ(y.get(0), 0.5);
  EXPECT_EQ(y.get(1), 0.0);
  EXPECT_EQ(y.get(2), 0.5);
}

TEST(Softmax, BackwardMatchesFiniteDifferences) {
  Rng rng(12);
  Tensor x = random_tensor({3, 7}, DType::f64, rng, 2.0);
  Tensor r = random_tensor({3, 7}, DType::f64, rng);
  Tensor y = Tensor::empty({3, 7}, DType::f64);
  auto loss = [&] {
    ref::softmax_forward(y, x);
    return weighted_sum(y, r);
  };
  loss();
  for (bool use_cpu : {false, true}) {
    Tensor dx = Tensor::empty({3, 7}, DType::f64);
    use_cpu ? cpu::softmax_backward(dx, r, y) : ref::softmax_backward(dx, r, y);
    EXPECT_TRUE(fd_check(loss, x, dx, use_cpu ? "cpu softmax dx" : "ref softmax dx"));
  }
}

TEST(Softmax, RejectsBadShapesAndDtypes) {
  Tensor x = Tensor::zeros({2, 4}, DType::f32);
  Tensor y_shape = Tensor::zeros({2, 5}, DType::f32);
  EXPECT_THROW(cpu::softmax_forward(y_shape, x), Error);
  EXPECT_THROW(ref::softmax_forward(y_shape, x), Error);
  Tensor y_bf16 = Tensor::zeros({2, 4}, DType::bf16);  // f32 in, bf16 out is not offered
  EXPECT_THROW(cpu::softmax_forward(y_bf16, x), Error);
  Tensor y = Tensor::zeros({2, 4}, DType::f32), dy64 = Tensor::zeros({2, 4}, DType::f64);
  Tensor dx = Tensor::zeros({2, 4}, DType::f32);
  EXPECT_THROW(cpu::softmax_backward(dx, dy64, y), Error);
}
