#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tiermoe/core/dtype.h"
#include "tiermoe/core/error.h"

using namespace tiermoe;

static uint16_t bits_of(float f) { return float_to_bf16(f).bits; }

TEST(Bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65280.0f}) {
    EXPECT_EQ(bf16_to_float(float_to_bf16(f)), f) << f;
  }
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(bits_of(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(bits_of(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above the halfway point rounds up.
  EXPECT_EQ(bits_of(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  // Just below rounds down.
  EXPECT_EQ(bits_of(1.0f + 0x1p-8f - 0x1p-20f), 0x3f80);
}

TEST(Bf16, SpecialValues) {
  float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bits_of(inf), 0x7f80);
  EXPECT_EQ(bits_of(-inf), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  // A NaN whose payload lives only in the low bits must not become infinity.
  float low_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_nan))));
  // The largest float rounds up to infinity, as RNE says.
  EXPECT_EQ(bits_of(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(DType, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float64"), DType::f64);
  EXPECT_THROW(parse_dtype("fp8"), Error);
  try {
    parse_dtype("half", "config.json: torch_dtype");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "config.json: torch_dtype");
    EXPECT_NE(std::string(e.what()).find("f64, f32, bf16"), std::string::npos);
  }
}
