// The flash attention's row operations (src/kernels/cpu/attention_math.h)
// against the C library in double: exp8 within 2 f32 ulps over the range it
// serves, its clamps, and NaN passing through; round_bf16_8 equal to
// float_to_bf16. The attention tests see these only through whole outputs,
// at tolerances an error of a few hundred ulps would pass.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../../src/kernels/cpu/attention_math.h"
#include "tiermoe/core/dtype.h"

namespace tiermoe {
namespace {

std::vector<float> exp8_of(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += 8) {
    _mm256_storeu_ps(y.data() + i, cpu::flash::exp8(_mm256_loadu_ps(x.data() + i)));
  }
  return y;
}

// Distance in f32 ulps between y and the double v (both normal and positive).
double ulps(float y, double v) {
  const double ulp = std::ldexp(1.0, std::ilogb(v) - 23);
  return std::abs(double(y) - v) / ulp;
}

TEST(AttentionMath, Exp8IsWithinTwoUlpsOnItsRange) {
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) x.push_back(-87.f + 175.f * float(i) / 200000.f);
  for (float v : {0.f, -0.f, 1e-8f, -1e-8f, 0.34657359f, -0.34657359f, 88.f}) x.push_back(v);
  while (x.size() % 8) x.push_back(0.f);
  const std::vector<float> y = exp8_of(x);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double u = ulps(y[i], std::exp(double(x[i])));
    worst = std::max(worst, u);
    ASSERT_LE(u, 2.0) << "exp(" << x[i] << ") = " << y[i];
  }
  EXPECT_GT(worst, 0.0);  // the comparison can see an error at all
}

TEST(AttentionMath, Exp8ClampsAndKeepsNaN) {
  const std::vector<float> x = {-1000.f, -INFINITY, 1000.f, INFINITY, NAN, -88.f, 89.f, 0.f};
  const std::vector<float> y = exp8_of(x);
  const float lo = exp8_of(std::vector<float>(8, -87.f))[0];
  const float hi = exp8_of(std::vector<float>(8, 88.f))[0];
  EXPECT_EQ(y[0], lo);
  EXPECT_EQ(y[1], lo);  // a masked score: tiny, never zero, so callers mask
  EXPECT_EQ(y[2], hi);
  EXPECT_EQ(y[3], hi);
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(y[5], lo);
  EXPECT_EQ(y[6], hi);
  EXPECT_EQ(y[7], 1.f);
  EXPECT_TRUE(std::isnormal(lo) && std::isfinite(hi));
}

TEST(AttentionMath, RoundBf16MatchesFloatToBf16) {
  std::vector<float> x;
  for (uint32_t i = 0; i < 4096; ++i) x.push_back(std::bit_cast<float>(0x3f800000u + i * 0x1001u));
  for (float v : {0.f, -0.f, 1e-39f, -3.3e38f, 65504.f}) x.push_back(v);
  while (x.size() % 8) x.push_back(1.f);
  for (size_t i = 0; i < x.size(); i += 8) {
    float y[8];
    _mm256_storeu_ps(y, cpu::flash::round_bf16_8(_mm256_loadu_ps(x.data() + i)));
    for (size_t j = 0; j < 8; ++j) {
      ASSERT_EQ(std::bit_cast<uint32_t>(y[j]),
                std::bit_cast<uint32_t>(bf16_to_float(float_to_bf16(x[i + j]))))
          << x[i + j];
    }
  }
}

}  // namespace
}  // namespace tiermoe
