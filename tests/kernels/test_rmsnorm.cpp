#include <gtest/gtest.h>

#include <cstring>  // testing.h uses std::memcmp without including it

#include "common/testing.h"
#include "tiermoe/kernels/rmsnorm.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

DType acc_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

double weighted_sum(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += y.get(i) * r.get(i);
  return s;
}

// cpu:: sums x^2 and g*n in vectorized order, ref:: left to right: rstd and
// the row dot differ by a few ulps of the accumulation type (f64 1e-12 and
// f32 1e-5 leave room for rows of a few thousand). In bf16, y is
// rounded twice (cast(x*rstd), then w*that), and each rounding can move one
// ulp when the inputs differ by an f32 ulp: two bf16 ulps, 2^-6 relative.
// dx has a cancellation (g - n*mean), so its floor is absolute.
struct Tol {
  double y_rtol, rstd_rtol, dx_rtol, dx_atol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::f64:
      return {1e-12, 1e-13, 1e-11, 1e-12};
    case DType::f32:
      return {1e-5, 1e-5, 1e-4, 1e-5};
    case DType::bf16:
      return {1.0 / 64, 1e-5, 1.0 / 64, 1e-4};
  }
  return {};
}

}  // namespace

TEST(RmsNorm, CpuMatchesRef) {
  Rng rng(31);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    Tol tol = tol_for(dt);
    for (Shape shape : {Shape{1, 7}, Shape{3, 64}, Shape{17, 130}, Shape{2, 5, 16}, Shape{1, 1},
                        Shape{64, 2048}}) {
      int64_t D = shape.back(), R = shape_numel(shape) / D;
      Tensor x = random_tensor(shape, dt, rng, 2.0);
      Tensor w = random_tensor({D}, dt, rng);
      Tensor y_ref = Tensor::empty(shape, dt), y_cpu = Tensor::empty(shape, dt);
      Tensor rstd_ref = Tensor::empty({R}, acc_dtype(dt)),
             rstd_cpu = Tensor::empty({R}, acc_dtype(dt));
      ref::rmsnorm_forward(y_ref, rstd_ref, x, w, 1e-6);
      cpu::rmsnorm_forward(y_cpu, rstd_cpu, x, w, 1e-6);
      const std::string what = x.str();
      EXPECT_TRUE(all_close(rstd_cpu, rstd_ref, tol.rstd_rtol, 0, "rstd " + what));
      EXPECT_TRUE(all_close(y_cpu, y_ref, tol.y_rtol, 0, "y " + what));

      Tensor dy = random_tensor(shape, dt, rng);
      Tensor dx_ref = random_tensor(shape, dt, rng), dx_cpu = dx_ref.clone();
      Tensor dw_ref = random_tensor({D}, acc_dtype(dt), rng), dw_cpu = dw_ref.clone();
      for (bool acc : {true, false}) {
        // Both twins read the same rstd, and dw adds rows in the same order
        // and rounds n the same way in both: bitwise.
        ref::rmsnorm_backward(dx_ref, dw_ref, dy, x, w, rstd_ref, acc);
        cpu::rmsnorm_backward(dx_cpu, dw_cpu, dy, x, w, rstd_ref, acc);
        EXPECT_TRUE(all_close(dx_cpu, dx_ref, tol.dx_rtol, tol.dx_atol, "dx " + what));
        EXPECT_TRUE(bitwise_equal(dw_cpu, dw_ref, "dw " + what));
      }
    }
  }
}

TEST(RmsNorm, KnownValuesAndEps) {
  Tensor x = Tensor::from_values({2, 2}, DType::f64, {3, 4, 0, 0});
  Tensor w = Tensor::from_values({2}, DType::f64, {1, 2});
  Tensor y = Tensor::empty({2, 2}, DType::f64), rstd = Tensor::empty({2}, DType::f64);
  cpu::rmsnorm_forward(y, rstd, x, w, 0.0);
  EXPECT_DOUBLE_EQ(rstd.get(0), 1 / std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(y.get(0), 3 / std::sqrt(12.5));
  EXPECT_DOUBLE_EQ(y.get(1), 8 / std::sqrt(12.5));
  // A zero row: eps keeps rstd finite and y zero.
  cpu::rmsnorm_forward(y, rstd, x, w, 0.25);
  EXPECT_DOUBLE_EQ(rstd.get(0), 1 / std::sqrt(12.75));
  EXPECT_DOUBLE_EQ(rstd.get(1), 2.0);
  EXPECT_EQ(y.get(2), 0.0);
  EXPECT_EQ(y.get(3), 0.0);
  // rstd is optional when no backward follows.
  Tensor none;
  Tensor y2 = Tensor::empty({2, 2}, DType::f64);
  ref::rmsnorm_forward(y2, none, x, w, 0.25);
  EXPECT_TRUE(bitwise_equal(y2, y, "y without rstd"));
}

// Hugging Face casts x*rstd back to bf16 before multiplying by w; multiplying
// first would round once. Check the twins round twice, on data where the two
// orders disagree somewhere.
TEST(RmsNorm, Bf16CastsBeforeWeight) {
  Rng rng(32);
  Tensor x = random_tensor({8, 256}, DType::bf16, rng);
  Tensor w = random_tensor({256}, DType::bf16, rng);
  Tensor rstd = Tensor::empty({8}, DType::f32);
  for (int twin = 0; twin < 2; ++twin) {
    Tensor y = Tensor::empty({8, 256}, DType::bf16);
    twin ? cpu::rmsnorm_forward(y, rstd, x, w, 1e-6) : ref::rmsnorm_forward(y, rstd, x, w, 1e-6);
    int64_t orders_differ = 0;
    for (int64_t r = 0; r < 8; ++r) {
      float s = float(rstd.get(r));
      for (int64_t d = 0; d < 256; ++d) {
        float n = bf16_to_float(float_to_bf16(float(x.get(r * 256 + d)) * s));
        float hf = bf16_to_float(float_to_bf16(float(w.get(d)) * n));
        float fused = bf16_to_float(float_to_bf16(float(w.get(d)) * float(x.get(r * 256 + d)) * s));
        ASSERT_EQ(float(y.get(r * 256 + d)), hf) << "row " << r << " col " << d;
        orders_differ += hf != fused;
      }
    }
    EXPECT_GT(orders_differ, 0) << "the data does not tell the two rounding orders apart";
  }
}

// gpt-oss's GptOssRMSNorm multiplies by w in f32 and rounds once; the twins
// do that with after_weight (on data where it differs from rounding twice),
// agree with each other forward and backward, and dw then sums the
// unrounded x * rstd. In f32 and f64 the two orders are the same bits.
TEST(RmsNorm, AfterWeightRoundsOnceAsGptOss) {
  Rng rng(33);
  Tensor x = random_tensor({8, 256}, DType::bf16, rng);
  Tensor w = random_tensor({256}, DType::bf16, rng);
  Tensor dy = random_tensor({8, 256}, DType::bf16, rng);
  Tensor rstd = Tensor::empty({8}, DType::f32), rstd_ref = Tensor::empty({8}, DType::f32);
  const RmsNormCast cast = RmsNormCast::after_weight;
  {
    Tensor y = Tensor::empty({8, 256}, DType::bf16);
    ref::rmsnorm_forward(y, rstd_ref, x, w, 1e-6, cast);  // both backwards read this one
  }
  std::vector<Tensor> dws;
  for (int twin = 0; twin < 2; ++twin) {
    Tensor y = Tensor::empty({8, 256}, DType::bf16);
    twin ? cpu::rmsnorm_forward(y, rstd, x, w, 1e-6, cast)
         : ref::rmsnorm_forward(y, rstd, x, w, 1e-6, cast);
    int64_t orders_differ = 0;
    for (int64_t r = 0; r < 8; ++r) {
      const float s = float(rstd.get(r));
      for (int64_t d = 0; d < 256; ++d) {
        const float n = float(x.get(r * 256 + d)) * s;
        const float once = bf16_to_float(float_to_bf16(float(w.get(d)) * n));
        const float twice =
            bf16_to_float(float_to_bf16(float(w.get(d)) * bf16_to_float(float_to_bf16(n))));
        ASSERT_EQ(float(y.get(r * 256 + d)), once) << "row " << r << " col " << d;
        orders_differ += once != twice;
      }
    }
    EXPECT_GT(orders_differ, 0) << "the data does not tell the two rounding orders apart";
    Tensor dx = Tensor::empty({8, 256}, DType::bf16), dw = Tensor::zeros({256}, DType::f32);
    twin ? cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd_ref, false, cast)
         : ref::rmsnorm_backward(dx, dw, dy, x, w, rstd_ref, false, cast);
    dws.push_back(dw);
    // dw_d = sum_r dy * x * rstd, unrounded.
    for (int64_t d : {0, 77, 255}) {
      double want = 0;
      for (int64_t r = 0; r < 8; ++r) {
        want += double(float(dy.get(r * 256 + d)) *
                       (float(x.get(r * 256 + d)) * float(rstd_ref.get(r))));
      }
      EXPECT_NEAR(dw.get(d), want, 1e-5 * (1 + std::abs(want))) << d;
    }
  }
  EXPECT_TRUE(bitwise_equal(dws[1], dws[0], "dw cpu vs ref"));
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor xf = random_tensor({4, 64}, dt, rng), wf = random_tensor({64}, dt, rng);
    Tensor r4 = Tensor::empty({4}, dt == DType::f64 ? DType::f64 : DType::f32);
    Tensor a = Tensor::empty({4, 64}, dt), b = Tensor::empty({4, 64}, dt);
    cpu::rmsnorm_forward(a, r4, xf, wf, 1e-6, RmsNormCast::after_weight);
    cpu::rmsnorm_forward(b, r4, xf, wf, 1e-6, RmsNormCast::after_normalize);
    EXPECT_TRUE(bitwise_equal(a, b, std::string(dtype_name(dt))));
  }
}

// Qwen3-Next's zero-centred weight: y = cast((1 + w) * x * rstd), 1 + w and
// the product in f32, one rounding. In f32 and f64 it is after_weight's
// result on a weight of 1 + w (those bits exactly); in bf16 each element is
// checked against the formula; the twins agree; backward by finite
// differences in f64 (dx through 1 + w, dw as after_weight's).
TEST(RmsNorm, UnitOffsetWeighsByOnePlusW) {
  Rng rng(35);
  const RmsNormCast cast = RmsNormCast::unit_offset;
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = random_tensor({5, 48}, dt, rng), w = random_tensor({48}, dt, rng, 0.1);
    Tensor w1 = w.clone();
    for (int64_t d = 0; d < 48; ++d) w1.set(d, 1.0 + w.get(d));
    Tensor r = Tensor::empty({5}, acc_dtype(dt));
    Tensor a = Tensor::empty(x.shape(), dt), b = Tensor::empty(x.shape(), dt);
    cpu::rmsnorm_forward(a, r, x, w, 1e-6, cast);
    cpu::rmsnorm_forward(b, r, x, w1, 1e-6, RmsNormCast::after_weight);
    EXPECT_TRUE(bitwise_equal(a, b, std::string(dtype_name(dt))));
  }
  Tensor x = random_tensor({6, 64}, DType::bf16, rng),
         w = random_tensor({64}, DType::bf16, rng, 0.1);
  Tensor y_ref = Tensor::empty(x.shape(), DType::bf16),
         y_cpu = Tensor::empty(x.shape(), DType::bf16);
  Tensor r_ref = Tensor::empty({6}, DType::f32), r_cpu = Tensor::empty({6}, DType::f32);
  ref::rmsnorm_forward(y_ref, r_ref, x, w, 1e-6, cast);
  cpu::rmsnorm_forward(y_cpu, r_cpu, x, w, 1e-6, cast);
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t d = 0; d < 64; ++d) {
      const float n = float(x.get(r * 64 + d)) * float(r_ref.get(r));
      const float want = bf16_to_float(float_to_bf16((1.0f + float(w.get(d))) * n));
      ASSERT_EQ(float(y_ref.get(r * 64 + d)), want) << r << " " << d;
    }
  }
  EXPECT_TRUE(all_close(y_cpu, y_ref, 1.0 / 64, 0, "cpu vs ref"));
  Tensor x64 = random_tensor({3, 8}, DType::f64, rng), w64 = random_tensor({8}, DType::f64, rng);
  const Tensor P = random_tensor(x64.shape(), DType::f64, rng);
  Tensor y = Tensor::empty(x64.shape(), DType::f64), rstd = Tensor::empty({3}, DType::f64);
  auto loss = [&] {
    ref::rmsnorm_forward(y, rstd, x64, w64, 1e-6, cast);
    return weighted_sum(y, P);
  };
  loss();
  for (int twin = 0; twin < 2; ++twin) {
    Tensor dx = Tensor::empty(x64.shape(), DType::f64), dw = Tensor::zeros({8}, DType::f64);
    twin ? cpu::rmsnorm_backward(dx, dw, P, x64, w64, rstd, false, cast)
         : ref::rmsnorm_backward(dx, dw, P, x64, w64, rstd, false, cast);
    EXPECT_TRUE(fd_check(loss, x64, dx, "x", 1e-6, 1e-9, 100)) << twin;
    EXPECT_TRUE(fd_check(loss, w64, dw, "w", 1e-6, 1e-9, 100)) << twin;
    loss();  // rstd back to the unperturbed input's
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Rng rng(33);
  for (double eps : {1e-6, 0.5}) {
    Shape shape{3, 2, 6};  // per-head use: rows of width 6, one weight for all heads
    Tensor x = random_tensor(shape, DType::f64, rng);
    Tensor w = random_tensor({6}, DType::f64, rng);
    Tensor r = random_tensor(shape, DType::f64, rng);
    Tensor y = Tensor::empty(shape, DType::f64), rstd = Tensor::empty({6}, DType::f64);
    auto loss = [&] {
      ref::rmsnorm_forward(y, rstd, x, w, eps);
      return weighted_sum(y, r);
    };
    loss();
    for (bool use_cpu : {false, true}) {
      Tensor dx = Tensor::empty(shape, DType::f64), dw = Tensor::empty({6}, DType::f64);
      use_cpu ? cpu::rmsnorm_backward(dx, dw, r, x, w, rstd)
              : ref::rmsnorm_backward(dx, dw, r, x, w, rstd);
      std::string twin = use_cpu ? "cpu" : "ref";
      EXPECT_TRUE(fd_check(loss, x, dx, twin + " rmsnorm dx eps " + std::to_string(eps)));
      EXPECT_TRUE(fd_check(loss, w, dw, twin + " rmsnorm dw eps " + std::to_string(eps)));
      // A frozen weight: dw undefined, dx unchanged.
      Tensor frozen, dx2 = Tensor::empty(shape, DType::f64);
      use_cpu ? cpu::rmsnorm_backward(dx2, frozen, r, x, w, rstd)
              : ref::rmsnorm_backward(dx2, frozen, r, x, w, rstd);
      EXPECT_TRUE(bitwise_equal(dx2, dx, twin + " dx without dw"));
    }
  }
}

TEST(RmsNorm, RejectsBadShapesAndDtypes) {
  Tensor x = Tensor::zeros({3, 8}, DType::bf16), y = Tensor::zeros({3, 8}, DType::bf16);
  Tensor rstd = Tensor::zeros({3}, DType::f32);
  Tensor w_bad = Tensor::zeros({7}, DType::bf16);
  EXPECT_THROW(cpu::rmsnorm_forward(y, rstd, x, w_bad, 1e-6), Error);
  EXPECT_THROW(ref::rmsnorm_forward(y, rstd, x, w_bad, 1e-6), Error);
  Tensor w = Tensor::zeros({8}, DType::bf16);
  Tensor rstd_bf16 = Tensor::zeros({3}, DType::bf16);
  EXPECT_THROW(cpu::rmsnorm_forward(y, rstd_bf16, x, w, 1e-6), Error);
  Tensor rstd_short = Tensor::zeros({2}, DType::f32);
  EXPECT_THROW(cpu::rmsnorm_forward(y, rstd_short, x, w, 1e-6), Error);
  Tensor dw_bf16 = Tensor::zeros({8}, DType::bf16);
  EXPECT_THROW(cpu::rmsnorm_backward(y, dw_bf16, x, x, w, rstd), Error);
  EXPECT_THROW(ref::rmsnorm_backward(y, dw_bf16, x, x, w, rstd), Error);
}
