#include <gtest/gtest.h>

#include <cstring>  // testing.h uses std::memcmp without including it
#include <vector>

#include "common/testing.h"
#include "tiermoe/kernels/rope.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

std::vector<int32_t> positions(int64_t B, int64_t T, int32_t offset = 0) {
  std::vector<int32_t> pos;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pos.push_back(int32_t(t) + offset * int32_t(b));
  return pos;
}

double weighted_sum(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += y.get(i) * r.get(i);
  return s;
}

}  // namespace

// The rounding points are part of the contract and both twins evaluate the
// same scalar expressions per element, so they agree bit for bit.
TEST(Rope, CpuMatchesRefBitwise) {
  Rng rng(41);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (auto [B, T, H, P] :
         {std::tuple{1, 1, 1, 2}, {2, 3, 3, 8}, {1, 17, 4, 64}, {3, 5, 2, 130}}) {
      std::vector<int32_t> pos = positions(B, T, 1000);
      int64_t R = B * T;
      Tensor c_ref = Tensor::empty({R, P}, dt), s_ref = Tensor::empty({R, P}, dt);
      Tensor c_cpu = Tensor::empty({R, P}, dt), s_cpu = Tensor::empty({R, P}, dt);
      ref::rope_tables(c_ref, s_ref, pos, 1e6);
      cpu::rope_tables(c_cpu, s_cpu, pos, 1e6);
      EXPECT_TRUE(bitwise_equal(c_cpu, c_ref, "cos " + c_ref.str()));
      EXPECT_TRUE(bitwise_equal(s_cpu, s_ref, "sin " + s_ref.str()));

      Shape shape{B, T, H, P};
      Tensor x = random_tensor(shape, dt, rng);
      Tensor y_ref = Tensor::empty(shape, dt), y_cpu = Tensor::empty(shape, dt);
      ref::rope_forward(y_ref, x, c_ref, s_ref);
      cpu::rope_forward(y_cpu, x, c_ref, s_ref);
      EXPECT_TRUE(bitwise_equal(y_cpu, y_ref, "rope y " + x.str()));

      Tensor dx_ref = random_tensor(shape, dt, rng), dx_cpu = dx_ref.clone();
      for (bool acc : {true, false}) {
        ref::rope_backward(dx_ref, x, c_ref, s_ref, acc);
        cpu::rope_backward(dx_cpu, x, c_ref, s_ref, acc);
        EXPECT_TRUE(bitwise_equal(dx_cpu, dx_ref, "rope dx " + x.str()));
      }
    }
  }
}

// Tables against the formula in f64. f32 tables carry the f32 angle error
// (pos * inv_freq rounded, ~pos * 2^-24 radians, so 1e-4 at pos 1000), bf16
// tables one more rounding (2^-8 relative, below 4e-3 absolute for |v| <= 1).
TEST(Rope, TablesFollowTheFormula) {
  std::vector<int32_t> pos = {0, 1, 7, 999};
  const int64_t P = 16;
  const double theta = 10000;
  for (auto [dt, atol] : {std::pair{DType::f64, 1e-12}, {DType::f32, 1e-4}, {DType::bf16, 4e-3}}) {
    Tensor c = Tensor::empty({4, P}, dt), s = Tensor::empty({4, P}, dt);
    cpu::rope_tables(c, s, pos, theta);
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t i = 0; i < P; ++i) {
        double ang = pos[size_t(r)] * std::pow(theta, -2.0 * double(i % (P / 2)) / double(P));
        EXPECT_NEAR(c.get(r * P + i), std::cos(ang), atol)
            << dtype_name(dt) << " r " << r << " i " << i;
        EXPECT_NEAR(s.get(r * P + i), std::sin(ang), atol)
            << dtype_name(dt) << " r " << r << " i " << i;
      }
    }
  }
}

TEST(Rope, RotatesHalvesNotNeighbours) {
  // P = 4: pairs (0, 2) and (1, 3). Position 1: angles 1 and theta^-1/2 = 0.01.
  std::vector<int32_t> pos = {1};
  Tensor c = Tensor::empty({1, 4}, DType::f64), s = Tensor::empty({1, 4}, DType::f64);
  ref::rope_tables(c, s, pos, 10000);
  Tensor x = Tensor::from_values({1, 1, 4}, DType::f64, {1, 2, 3, 4});
  Tensor y = Tensor::empty({1, 1, 4}, DType::f64);
  cpu::rope_forward(y, x, c, s);
  EXPECT_NEAR(y.get(0), 1 * std::cos(1.0) - 3 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(y.get(2), 3 * std::cos(1.0) + 1 * std::sin(1.0), 1e-15);
  EXPECT_NEAR(y.get(1), 2 * std::cos(0.01) - 4 * std::sin(0.01), 1e-15);
  EXPECT_NEAR(y.get(3), 4 * std::cos(0.01) + 2 * std::sin(0.01), 1e-15);
  // Position 0 is the identity; y may alias x.
  std::vector<int32_t> zero = {0};
  ref::rope_tables(c, s, zero, 10000);
  cpu::rope_forward(x, x, c, s);
  EXPECT_EQ(x.to_vector(), (std::vector<double>{1, 2, 3, 4}));
}

// HF's bf16 code rounds x*cos, rotate_half(x)*sin and their sum separately.
TEST(Rope, Bf16RoundsEachStep) {
  Rng rng(42);
  std::vector<int32_t> pos = positions(1, 9);
  Tensor c = Tensor::empty({9, 32}, DType::bf16), s = Tensor::empty({9, 32}, DType::bf16);
  cpu::rope_tables(c, s, pos, 10000);
  Tensor x = random_tensor({9, 2, 32}, DType::bf16, rng);
  Tensor y = Tensor::empty({9, 2, 32}, DType::bf16);
  cpu::rope_forward(y, x, c, s);
  auto bf = [](double v) { return double(bf16_to_float(float_to_bf16(float(v)))); };
  int64_t differs_from_single_rounding = 0;
  for (int64_t r = 0; r < 9; ++r) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 32; ++i) {
        int64_t j = i < 16 ? i + 16 : i - 16;
        double sign = i < 16 ? -1 : 1;
        double xi = x.get((r * 2 + h) * 32 + i), xj = x.get((r * 2 + h) * 32 + j);
        double ci = c.get(r * 32 + i), si = s.get(r * 32 + i);
        double want = bf(bf(xi * ci) + bf(sign * xj * si));
        ASSERT_EQ(y.get((r * 2 + h) * 32 + i), want) << "row " << r << " head " << h << " i " << i;
        differs_from_single_rounding += want != bf(xi * ci + sign * xj * si);
      }
    }
  }
  EXPECT_GT(differs_from_single_rounding, 0);
}

TEST(Rope, BackwardMatchesFiniteDifferences) {
  Rng rng(43);
  std::vector<int32_t> pos = positions(2, 3, 5);
  Tensor c = Tensor::empty({6, 6}, DType::f64), s = Tensor::empty({6, 6}, DType::f64);
  ref::rope_tables(c, s, pos, 100);
  Shape shape{2, 3, 2, 6};
  Tensor x = random_tensor(shape, DType::f64, rng), r = random_tensor(shape, DType::f64, rng);
  Tensor y = Tensor::empty(shape, DType::f64);
  auto loss = [&] {
    ref::rope_forward(y, x, c, s);
    return weighted_sum(y, r);
  };
  for (bool use_cpu : {false, true}) {
    Tensor dx = Tensor::empty(shape, DType::f64);
    use_cpu ? cpu::rope_backward(dx, r, c, s) : ref::rope_backward(dx, r, c, s);
    EXPECT_TRUE(fd_check(loss, x, dx, use_cpu ? "cpu rope dx" : "ref rope dx", 1e-6, 1e-8, 72));
  }
}

TEST(Rope, RejectsBadShapes) {
  std::vector<int32_t> pos = {0, 1, 2};
  Tensor c_odd = Tensor::empty({3, 5}, DType::f32), s_odd = Tensor::empty({3, 5}, DType::f32);
  EXPECT_THROW(cpu::rope_tables(c_odd, s_odd, pos, 1e4), Error);
  Tensor c = Tensor::empty({3, 4}, DType::f32), s = Tensor::empty({3, 4}, DType::f32);
  EXPECT_THROW(ref::rope_tables(c, s, pos, 0.0), Error);
  std::vector<int32_t> two = {0, 1};
  EXPECT_THROW(cpu::rope_tables(c, s, two, 1e4), Error);
  cpu::rope_tables(c, s, pos, 1e4);
  Tensor x_rows = Tensor::zeros({2, 2, 4}, DType::f32),
         y_rows = Tensor::zeros({2, 2, 4}, DType::f32);
  EXPECT_THROW(cpu::rope_forward(y_rows, x_rows, c, s), Error);
  EXPECT_THROW(ref::rope_forward(y_rows, x_rows, c, s), Error);
  // Heads narrower than the tables (wider ones are partial rotary).
  Tensor x_width = Tensor::zeros({3, 2, 2}, DType::f32),
         y_width = Tensor::zeros({3, 2, 2}, DType::f32);
  EXPECT_THROW(cpu::rope_forward(y_width, x_width, c, s), Error);
  EXPECT_THROW(ref::rope_backward(y_width, x_width, c, s), Error);
  Tensor x_bf16 = Tensor::zeros({3, 2, 4}, DType::bf16),
         y_bf16 = Tensor::zeros({3, 2, 4}, DType::bf16);
  EXPECT_THROW(cpu::rope_backward(y_bf16, x_bf16, c, s), Error);
}

// Partial rotary (GLM-4.5): tables of width Pr < P rotate each head's first
// Pr values as a head of width Pr would be, and pass the rest through; cpu
// equals ref bitwise, and backward is the transpose (finite differences).
TEST(Rope, PartialRotaryRotatesTheFirstDimsOnly) {
  Rng rng(44);
  const int64_t B = 2, T = 3, H = 2, P = 10, Pr = 4;
  std::vector<int32_t> pos = positions(B, T, 7);
  for (DType dt : {DType::f64, DType::bf16}) {
    Tensor c = Tensor::empty({B * T, Pr}, dt), s = Tensor::empty({B * T, Pr}, dt);
    ref::rope_tables(c, s, pos, 100);
    Tensor x = random_tensor({B, T, H, P}, dt, rng);
    Tensor y = Tensor::empty({B, T, H, P}, dt), y_cpu = Tensor::empty({B, T, H, P}, dt);
    ref::rope_forward(y, x, c, s);
    cpu::rope_forward(y_cpu, x, c, s);
    EXPECT_TRUE(bitwise_equal(y_cpu, y, "partial rope y"));
    // The rotated part, against a head of width Pr.
    Tensor x_rot = Tensor::empty({B, T, H, Pr}, dt), y_rot = Tensor::empty({B, T, H, Pr}, dt);
    for (int64_t r = 0; r < B * T * H; ++r) {
      for (int64_t i = 0; i < Pr; ++i) x_rot.set(r * Pr + i, x.get(r * P + i));
    }
    ref::rope_forward(y_rot, x_rot, c, s);
    for (int64_t r = 0; r < B * T * H; ++r) {
      for (int64_t i = 0; i < P; ++i) {
        const double want = i < Pr ? y_rot.get(r * Pr + i) : x.get(r * P + i);
        ASSERT_EQ(y.get(r * P + i), want) << dtype_name(dt) << " row " << r << " dim " << i;
      }
    }
    Tensor dx = random_tensor({B, T, H, P}, dt, rng), dx_cpu = dx.clone();
    for (bool acc : {true, false}) {
      ref::rope_backward(dx, x, c, s, acc);
      cpu::rope_backward(dx_cpu, x, c, s, acc);
      EXPECT_TRUE(bitwise_equal(dx_cpu, dx, "partial rope dx"));
    }
  }
  Tensor c = Tensor::empty({B * T, Pr}, DType::f64), s = Tensor::empty({B * T, Pr}, DType::f64);
  ref::rope_tables(c, s, pos, 100);
  Tensor x = random_tensor({B, T, H, P}, DType::f64, rng);
  Tensor r = random_tensor({B, T, H, P}, DType::f64, rng),
         y = Tensor::empty({B, T, H, P}, DType::f64);
  auto loss = [&] {
    ref::rope_forward(y, x, c, s);
    return weighted_sum(y, r);
  };
  Tensor dx = Tensor::empty({B, T, H, P}, DType::f64);
  cpu::rope_backward(dx, r, c, s);
  EXPECT_TRUE(fd_check(loss, x, dx, "partial rope dx", 1e-6, 1e-8, 72));
}

// Tables from given frequencies (YaRN's) and a scale: cpu equals ref
// bitwise, each entry is cos/sin(pos * f_i) * scale, and the plain tables
// are the same function of theta's frequencies at scale 1.
TEST(Rope, ScaledTablesFromGivenFrequencies) {
  std::vector<int32_t> pos = positions(2, 5, 3);
  const std::vector<double> freqs = {1.0, 0.3, 0.05, 0.001};
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    Tensor c = Tensor::empty({10, 8}, dt), s = Tensor::empty({10, 8}, dt);
    Tensor c2 = Tensor::empty({10, 8}, dt), s2 = Tensor::empty({10, 8}, dt);
    ref::rope_tables_scaled(c, s, pos, freqs, 1.25);
    cpu::rope_tables_scaled(c2, s2, pos, freqs, 1.25);
    EXPECT_TRUE(bitwise_equal(c2, c, "scaled cos"));
    EXPECT_TRUE(bitwise_equal(s2, s, "scaled sin"));
    const double tol = dt == DType::bf16 ? 1e-2 : dt == DType::f32 ? 1e-6 : 1e-14;
    for (int64_t r = 0; r < 10; ++r) {
      for (int64_t i = 0; i < 4; ++i) {
        EXPECT_NEAR(c.get(r * 8 + i), std::cos(pos[size_t(r)] * freqs[size_t(i)]) * 1.25, tol);
        EXPECT_NEAR(s.get(r * 8 + i + 4), std::sin(pos[size_t(r)] * freqs[size_t(i)]) * 1.25, tol);
      }
    }
  }
  std::vector<double> bad = {1.0, 0.0, 0.5, 0.25};
  Tensor c = Tensor::empty({10, 8}, DType::f64), s = Tensor::empty({10, 8}, DType::f64);
  EXPECT_THROW(cpu::rope_tables_scaled(c, s, pos, bad, 1.0), Error);
  EXPECT_THROW(ref::rope_tables_scaled(c, s, pos, std::span(freqs).first(3), 1.0), Error);
}
