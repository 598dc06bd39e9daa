#include "tiermoe/kernels/quant_image.h"

#include <cstring>
#include <vector>

#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe {

using detail::str_of;

std::string QuantLayout::str() const {
  std::string s = str_of(quant_format_name(format), " g", group);
  if (row_group != 1) s += str_of(" r", row_group);
  if (bf16_values) s += " bf16";
  return s;
}

QuantLayout quant_layout(const QuantMatrix& q) {
  return QuantLayout{q.format, q.group, q.row_group, q.bf16_values};
}

QuantImage quant_image(const QuantLayout& l, int64_t rows, int64_t cols) {
  QuantImage im;
  im.codes_bytes = rows * quant_code_row_bytes(l.format, cols);
  im.scales_offset = (im.codes_bytes + kQuantImageAlign - 1) / kQuantImageAlign * kQuantImageAlign;
  const int64_t scale_rows = (rows + l.row_group - 1) / l.row_group;
  const int64_t scale_cols = (cols + l.group - 1) / l.group;
  im.scales_bytes = scale_rows * scale_cols * quant_scale_bytes(l.format);
  im.bytes = (im.scales_offset + im.scales_bytes + kQuantImageAlign - 1) / kQuantImageAlign *
             kQuantImageAlign;
  return im;
}

QuantMatrix quant_image_view(const QuantLayout& l, int64_t rows, int64_t cols, const void* base) {
  const QuantImage im = quant_image(l, rows, cols);
  QuantMatrix q;
  q.format = l.format;
  q.rows = rows, q.cols = cols, q.group = l.group, q.row_group = l.row_group;
  q.bf16_values = l.bf16_values;
  q.codes = static_cast<const uint8_t*>(base);
  q.code_stride = quant_code_row_bytes(l.format, cols);
  q.scales = static_cast<const char*>(base) + im.scales_offset;
  q.scale_stride = q.scale_cols();
  return q;
}

bool quant_rows_dense(const QuantMatrix& q) {
  return q.code_stride == quant_code_row_bytes(q.format, q.cols) &&
         q.scale_stride == q.scale_cols();
}

void write_quant_image(const QuantMatrix& q, void* dst) {
  check_quant_matrix(q, "write_quant_image");
  const QuantImage im = quant_image(quant_layout(q), q.rows, q.cols);
  char* out = static_cast<char*>(dst);
  std::memset(out, 0, size_t(im.bytes));
  const int64_t row_bytes = quant_code_row_bytes(q.format, q.cols);
  for (int64_t r = 0; r < q.rows; ++r) {
    std::memcpy(out + r * row_bytes, q.codes + r * q.code_stride, size_t(row_bytes));
  }
  const int64_t sb = quant_scale_bytes(q.format), scale_row_bytes = q.scale_cols() * sb;
  const char* scales = static_cast<const char*>(q.scales);
  for (int64_t r = 0; r < q.scale_rows(); ++r) {
    std::memcpy(out + im.scales_offset + r * scale_row_bytes, scales + r * q.scale_stride * sb,
                size_t(scale_row_bytes));
  }
}

void dequantize_into(const QuantMatrix& q, Tensor& w_NK) {
  check_quant_matrix(q, "dequantize_into");
  TIERMOE_CHECK(
      w_NK.defined() && w_NK.dim() == 2 && w_NK.size(0) == q.rows && w_NK.size(1) == q.cols,
      str_of("dequantize_into a ", w_NK.defined() ? w_NK.str() : "undefined tensor", " from a [",
             q.rows, ", ", q.cols, "] matrix"),
      "dequantize_into", "pass a contiguous tensor of the matrix's shape");
  const int64_t K = q.cols;
  parallel_for(q.rows, 4, [&](int64_t r0, int64_t r1) {
    if (w_NK.dtype() == DType::bf16) {
      for (int64_t r = r0; r < r1; ++r) dequantize_row_bf16(q, r, 0, K, w_NK.data<bf16>() + r * K);
      return;
    }
    if (w_NK.dtype() == DType::f32) {
      for (int64_t r = r0; r < r1; ++r) dequantize_row(q, r, 0, K, w_NK.data<float>() + r * K);
      return;
    }
    std::vector<float> row(static_cast<size_t>(K));
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_row(q, r, 0, K, row.data());
      double* out = w_NK.data<double>() + r * K;
      for (int64_t c = 0; c < K; ++c) out[c] = row[size_t(c)];  // exact
    }
  });
}

QuantMatrix random_quant_matrix(const QuantLayout& l, int64_t rows, int64_t cols, Rng& rng) {
  QuantBuffer b = alloc_quant_matrix(l.format, rows, cols, l.group, l.row_group);
  b.matrix.bf16_values = l.bf16_values;
  const QuantMatrix& q = b.matrix;
  for (int64_t i = 0; i < q.rows * q.code_stride; ++i) {
    const auto byte = uint8_t(rng.next_u64());
    // fp8: S.0eee.mmm, exponents up to 2^-1 (e4m3's NaN is S.1111.111).
    b.codes[i] = l.format == QuantFormat::fp8 ? uint8_t(byte & 0xb7) : byte;
  }
  for (int64_t i = 0; i < q.scale_rows() * q.scale_stride; ++i) {
    if (l.format == QuantFormat::mxfp4) {
      static_cast<uint8_t*>(b.scales)[i] = uint8_t(120 + rng.next_u64() % 4);  // 2^-7 .. 2^-4
    } else {
      static_cast<float*>(b.scales)[i] = float(rng.uniform(0.005, 0.02));
    }
  }
  return q;
}

}  // namespace tiermoe
