#pragma once
// A low-width matrix (kernels/quant.h) as one contiguous block of bytes, the
// way a device holds a resident expert's frozen weights (tier/device.h):
// its codes at their minimum row stride, then its scales at the next
// kQuantImageAlign-byte boundary, the whole padded to that boundary too (so
// what follows an image in a buffer stays aligned). A
// QuantLayout (a matrix's format without its bytes or sizes) is what a
// graph is compiled for; an image is what an upload writes and a graph
// reads back as a QuantMatrix.
#include <compare>
#include <cstdint>
#include <string>

#include "tiermoe/core/random.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {

struct QuantLayout {
  QuantFormat format = QuantFormat::int4;
  int64_t group = 0;      // QuantMatrix::group
  int64_t row_group = 1;  // QuantMatrix::row_group
  bool bf16_values = false;
  auto operator<=>(const QuantLayout&) const = default;
  std::string str() const;  // "int4 g128", "int4 g32 bf16", "mxfp4 g32", "fp8 g128 r128"
};
QuantLayout quant_layout(const QuantMatrix& q);

inline constexpr int64_t kQuantImageAlign = 64;

struct QuantImage {
  int64_t codes_bytes = 0;    // rows x the minimum code stride
  int64_t scales_offset = 0;  // codes_bytes rounded up to kQuantImageAlign
  int64_t scales_bytes = 0;   // scale rows x scale columns x the scale's bytes
  int64_t bytes = 0;          // the whole image, a multiple of kQuantImageAlign
  int64_t words() const { return bytes / 4; }
};
QuantImage quant_image(const QuantLayout& layout, int64_t rows, int64_t cols);

// The matrix an image at `base` holds (a view: no owner).
QuantMatrix quant_image_view(const QuantLayout& layout, int64_t rows, int64_t cols,
                             const void* base);
// Whether q's codes and its scales each lie at the image's strides, so the
// two regions can be copied as they are (else write_quant_image).
bool quant_rows_dense(const QuantMatrix& q);
// Writes q's image to dst (quant_image(...).bytes bytes, the gap zeroed).
void write_quant_image(const QuantMatrix& q, void* dst);

// Decodes q into w_NK ([rows, cols], contiguous, f64, f32 or bf16): the
// values dequantize() gives, row by row on the kernels' expansion
// (dequantize_row, dequantize_row_bf16).
void dequantize_into(const QuantMatrix& q, Tensor& w_NK);

// A matrix of `layout` with random codes (fp8's clear of NaN and of the
// largest exponents) and scales of about a weight's size: what the quantized
// kernels read at a run's width, for the start-up measurements and tests.
QuantMatrix random_quant_matrix(const QuantLayout& layout, int64_t rows, int64_t cols, Rng& rng);

}  // namespace tiermoe
