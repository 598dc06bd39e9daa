// A low-width matrix as a device holds it (kernels/quant_image.h): the image
// of a matrix with strided rows reads back as the same values, the image's
// sizes are what a device allocates, and dequantize_into (what the device
// graphs decode with) gives dequantize()'s values bit for bit in every dtype.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/testing.h"
#include "tiermoe/kernels/quant_image.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;

const std::vector<QuantLayout> kLayouts = {
    {QuantFormat::int4, 16, 1, false},   {QuantFormat::int4, 24, 1, true},
    {QuantFormat::int8, 8, 1, false},    {QuantFormat::mxfp4, 32, 1, false},
    {QuantFormat::fp8, 128, 128, false}, {QuantFormat::fp8, 128, 1, false}};

// The left `cols` columns of a wider random matrix: rows strided past the
// image's minimum, codes and scales both.
QuantMatrix strided(const QuantLayout& l, int64_t rows, int64_t cols, Rng& rng) {
  QuantMatrix q = random_quant_matrix(l, rows, cols + 3 * l.group, rng);
  q.cols = cols;
  return q;
}

TEST(QuantImage, AStridedMatrixReadsBackAsTheSameValues) {
  Rng rng(5);
  for (const QuantLayout& l : kLayouts) {
    for (auto [rows, cols] : {std::pair{7, 40}, std::pair{130, 200}, std::pair{1, 1}}) {
      const std::string where = detail::str_of(l.str(), " [", rows, ", ", cols, "]");
      const QuantMatrix q = strided(l, rows, cols, rng);
      ASSERT_FALSE(quant_rows_dense(q)) << where;
      const QuantImage im = quant_image(l, rows, cols);
      EXPECT_EQ(im.bytes % kQuantImageAlign, 0) << where;
      EXPECT_EQ(im.scales_offset % kQuantImageAlign, 0) << where;
      EXPECT_GE(im.scales_offset, im.codes_bytes) << where;
      EXPECT_EQ(im.codes_bytes + im.scales_bytes, q.bytes()) << where;  // the stored bytes
      std::vector<uint8_t> image(size_t(im.bytes), 0xee);
      write_quant_image(q, image.data());
      const QuantMatrix back = quant_image_view(l, rows, cols, image.data());
      EXPECT_TRUE(quant_rows_dense(back)) << where;
      EXPECT_EQ(quant_layout(back), l) << where;
      EXPECT_TRUE(bitwise_equal(dequantize(back, DType::f32), dequantize(q, DType::f32), where));
      // ... and a spoiled byte of the codes shows.
      image[0] ^= 0x01;  // column 0, in every format
      EXPECT_FALSE(bitwise_equal(dequantize(back, DType::f32), dequantize(q, DType::f32), where));
    }
  }
}

TEST(QuantImage, DequantizeIntoGivesTheOraclesValues) {
  Rng rng(6);
  for (const QuantLayout& l : kLayouts) {
    const QuantMatrix q = strided(l, 131, 72, rng);
    for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
      const std::string where = detail::str_of(l.str(), " ", dtype_name(dt));
      Tensor w = Tensor::empty({131, 72}, dt);
      dequantize_into(q, w);
      EXPECT_TRUE(bitwise_equal(w, dequantize(q, dt), where));
    }
  }
  Tensor wrong = Tensor::empty({3, 3}, DType::f32);
  EXPECT_THROW(dequantize_into(strided(kLayouts[0], 4, 16, rng), wrong), Error);
}

TEST(QuantImage, LayoutsNameTheirFormat) {
  EXPECT_EQ((QuantLayout{QuantFormat::int4, 128, 1, true}).str(), "int4 g128 bf16");
  EXPECT_EQ((QuantLayout{QuantFormat::fp8, 128, 128, false}).str(), "fp8 g128 r128");
}

}  // namespace
}  // namespace tiermoe
