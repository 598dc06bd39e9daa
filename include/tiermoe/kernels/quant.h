#pragma once
// Frozen matrices kept at the width a checkpoint ships them in: a matrix
// W [rows, cols] (nn.Linear's [out, in]; cols is the products' K in the
// forward) stored as small codes and scales along its rows, never widened
// as a whole. The GEMM expands them panel by panel while packing its weight
// operand (kernels/grouped_matmul.h), so only the stored bytes stay
// resident. Formats (the layouts of the files they come from, unchanged):
//
//   int4   compressed-tensors pack-quantized, symmetric: a code q in [-8, 7]
//          is the nibble q + 8; element 2i of a row in the low nibble of
//          byte i, 2i + 1 in the high one (the int32 words' little-endian
//          bytes); each row's bytes padded to whole words (8 elements).
//          W = q * scale[row, col / group], scales kept as f32 (bf16 and f16
//          scales widen exactly).
//   int8   one signed byte per element; W = q * scale[row, col / group].
//   mxfp4  gpt-oss's E2M1 codes, the nibble order of int4, a block of 32
//          per E8M0 exponent: W = e2m1[code] * 2^(scale - 127).
//   fp8    float8_e4m3fn bytes, one f32 multiplier per 128 x 128 block
//          (DeepSeek's weight_scale_inv): W = fp8(code) * scale[row / 128,
//          col / 128], partial edge blocks using their block's scale. Two
//          such matrices stacked along rows (gate over up) keep a row of
//          scales per row when the first's rows are not whole blocks.
//
// Every value decodes to f32 exactly except where q * scale itself rounds
// (an f32 scale with more than 16 significant bits times an int8 code, or
// bf16_values); the products then round it to their dtype the way any f32
// weight is rounded, so a quantized product equals the same product over
// dequantize(w, dt), bit for bit (tests/kernels/test_quant.cpp).
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

enum class QuantFormat : uint8_t { int4, int8, mxfp4, fp8 };

// MXFP4's E2M1 code -> value (bit 3 the sign), before the block's 2^(e - 127).
inline constexpr float kE2m1Values[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                          -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

std::string_view quant_format_name(QuantFormat f);  // "int4", "int8", "mxfp4", "fp8"
// Parses a format name; throws naming `where` otherwise.
QuantFormat parse_quant_format(std::string_view s, std::string_view where);
// Bits per stored code.
int quant_code_bits(QuantFormat f);
// The fewest bytes a row of `cols` codes takes (int4: whole 32-bit words).
int64_t quant_code_row_bytes(QuantFormat f, int64_t cols);
// Bytes per stored scale: 4 (f32), 1 (mxfp4's E8M0).
int64_t quant_scale_bytes(QuantFormat f);

struct QuantMatrix {
  QuantFormat format = QuantFormat::int4;
  int64_t rows = 0, cols = 0;
  // Columns per scale (int4/int8: the checkpoint's group size, or cols for
  // a per-channel scale; mxfp4 32; fp8 128, and 128 rows).
  int64_t group = 0;
  // Rows per row of scales: 1, or fp8's 128 as shipped.
  int64_t row_group = 1;
  const uint8_t* codes = nullptr;
  int64_t code_stride = 0;  // bytes from one row's codes to the next
  // f32 (int4, int8, fp8) or E8M0 bytes (mxfp4), scale_stride per row of
  // scales (row `r`'s are row r / row_group).
  const void* scales = nullptr;
  int64_t scale_stride = 0;
  // int4/int8 with bf16 scales: each value is bf16(q * scale), the product
  // compressed-tensors (and so transformers and vLLM) computes in the
  // scales' dtype; else the f32 product.
  bool bf16_values = false;
  // Keeps the codes and scales alive: an owned buffer or a mapped file.
  std::shared_ptr<const void> owner;

  bool defined() const { return codes != nullptr; }
  // Scales along a row (and, for fp8, rows of them).
  int64_t scale_cols() const { return (cols + group - 1) / group; }
  int64_t scale_rows() const { return (rows + row_group - 1) / row_group; }
  // The bytes codes and scales take (what stays resident).
  int64_t bytes() const;
  // Expert e's matrix of a stack stored [E, rows, cols] with codes and
  // scales contiguous per matrix: a view sharing the owner.
  QuantMatrix slice(int64_t e, int64_t code_bytes_per_matrix, int64_t scales_per_matrix) const;
};

// A matrix with codes and scales of its own (zeroed, tracked under `tag`),
// strides at their minimum, for a reader or quantizer to fill through the
// writable pointers.
struct QuantBuffer {
  QuantMatrix matrix;
  uint8_t* codes = nullptr;
  void* scales = nullptr;
};
QuantBuffer alloc_quant_matrix(QuantFormat format, int64_t rows, int64_t cols, int64_t group,
                               int64_t row_group = 1, MemTag tag = MemTag::weights);

// Matrices of one format, width and group stacked along rows (an expert's
// gate over its up): a copy. fp8 parts keep 128-row scale blocks when every
// part but the last has whole blocks, else a row of scales per row.
QuantMatrix stack_quant_rows(const std::vector<QuantMatrix>& parts, MemTag tag = MemTag::weights);

// A matrix's bytes for rows x cols in `format` with `group` (memory plans).
int64_t quant_bytes(QuantFormat format, int64_t rows, int64_t cols, int64_t group);

// Decodes row `row`'s columns [c0, c0 + n) to f32 (the kernels' expansion;
// vectorized where the format allows).
void dequantize_row(const QuantMatrix& q, int64_t row, int64_t c0, int64_t n, float* out);

// The same rounded to bf16 (float_to_bf16 of each value): what the bf16
// products' packing reads (kernels/cpu/quant_decode.cpp, AVX2).
void dequantize_row_bf16(const QuantMatrix& q, int64_t row, int64_t c0, int64_t n, bf16* out);

// The oracle: the whole matrix decoded element by element from the format's
// definition, in f32 or f64 (exact), or bf16 (each f32 value rounded to
// nearest even, as the bf16 products round a weight while packing it).
Tensor dequantize(const QuantMatrix& q, DType dt, MemTag tag = MemTag::activations);

// Quantizes w_NK (any dtype, taken as f32) symmetrically per group of
// `group` columns to int4 or int8, the rule compressed-tensors applies:
// scale = max|w| over the group / 7.5 (int4) or / 127.5 (int8), rounded to
// bf16 (the scale the checkpoint stores), then q = clamp(round_half_even(w /
// scale), qmin, qmax); its values are bf16(q * scale) (bf16_values).
// An all-zero group gets the smallest positive bf16 scale. Owns its bytes.
QuantMatrix quantize_int(const Tensor& w_NK, QuantFormat format, int64_t group,
                         MemTag tag = MemTag::weights);

// MXFP4 by the OCP Microscaling rule: per block of 32 columns the shared
// exponent e = floor(log2(max |w|)) - 2 (E2M1's largest), stored as e + 127
// (clamped to [0, 254]; 0 for an all-zero block), and each w / 2^e rounded
// to the nearest E2M1 value, ties to the even code, saturating at 6.
// cols must be a multiple of 32. Owns its bytes.
QuantMatrix quantize_mxfp4(const Tensor& w_NK, MemTag tag = MemTag::weights);

// Checks a matrix's fields against its format (group, strides, pointers);
// throws naming `what` with the first that is wrong.
void check_quant_matrix(const QuantMatrix& q, std::string_view what);

}  // namespace tiermoe
