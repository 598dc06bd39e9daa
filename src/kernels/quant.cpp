// Stored low-bit matrices (kernels/quant.h): the format's definition as an
// element-by-element oracle, the row decoder the GEMM's packing calls, and
// the symmetric integer quantizer.
#include "tiermoe/kernels/quant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe {

using detail::str_of;

namespace {

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
// infinities, S.1111.111 is NaN, subnormals at exponent 0.
float fp8_e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float sign = (b & 0x80) ? -1.f : 1.f;
  if (e == 15 && m == 7) return std::copysign(std::numeric_limits<float>::quiet_NaN(), sign);
  if (e == 0) return sign * std::ldexp(float(m) / 8.f, -6);
  return sign * std::ldexp(1.f + float(m) / 8.f, e - 7);
}

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int b = 0; b < 256; ++b) v[size_t(b)] = fp8_e4m3_value(uint8_t(b));
    return v;
  }();
  return t;
}

// The code (before scaling) of element `col` in a row's codes.
float code_value(QuantFormat f, const uint8_t* row_codes, int64_t col) {
  switch (f) {
    case QuantFormat::int4: {
      const uint8_t byte = row_codes[col / 2];
      return float(int((col & 1) ? byte >> 4 : byte & 15) - 8);
    }
    case QuantFormat::int8:
      return float(int8_t(row_codes[col]));
    case QuantFormat::mxfp4: {
      const uint8_t byte = row_codes[col / 2];
      return kE2m1Values[(col & 1) ? byte >> 4 : byte & 15];
    }
    case QuantFormat::fp8:
      return fp8_table()[row_codes[col]];
  }
  __builtin_unreachable();
}

// Element (r, c) as the format defines it, in f32.
float element(const QuantMatrix& q, int64_t r, int64_t c) {
  const float code = code_value(q.format, q.codes + r * q.code_stride, c);
  const int64_t s = (r / q.row_group) * q.scale_stride + c / q.group;
  switch (q.format) {
    case QuantFormat::int4:
    case QuantFormat::int8: {
      const float v = code * static_cast<const float*>(q.scales)[s];
      return q.bf16_values ? bf16_to_float(float_to_bf16(v)) : v;
    }
    case QuantFormat::mxfp4:
      return std::ldexp(code, int(static_cast<const uint8_t*>(q.scales)[s]) - 127);
    case QuantFormat::fp8:
      return code * static_cast<const float*>(q.scales)[s];
  }
  __builtin_unreachable();
}

}  // namespace

std::string_view quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::int4: return "int4";
    case QuantFormat::int8: return "int8";
    case QuantFormat::mxfp4: return "mxfp4";
    case QuantFormat::fp8: return "fp8";
  }
  __builtin_unreachable();
}

QuantFormat parse_quant_format(std::string_view s, std::string_view where) {
  for (QuantFormat f : {QuantFormat::int4, QuantFormat::int8, QuantFormat::mxfp4, QuantFormat::fp8}) {
    if (s == quant_format_name(f)) return f;
  }
  throw Error(str_of("unknown quantized format '", s, "'"), std::string(where),
              "use int4, int8, mxfp4 or fp8");
}

int quant_code_bits(QuantFormat f) {
  return f == QuantFormat::int4 || f == QuantFormat::mxfp4 ? 4 : 8;
}

int64_t quant_code_row_bytes(QuantFormat f, int64_t cols) {
  switch (f) {
    case QuantFormat::int4: return (cols + 7) / 8 * 4;  // whole int32 words
    case QuantFormat::mxfp4: return (cols + 1) / 2;
    case QuantFormat::int8:
    case QuantFormat::fp8: return cols;
  }
  __builtin_unreachable();
}

int64_t quant_scale_bytes(QuantFormat f) { return f == QuantFormat::mxfp4 ? 1 : 4; }

int64_t quant_bytes(QuantFormat format, int64_t rows, int64_t cols, int64_t group) {
  const int64_t scale_rows = format == QuantFormat::fp8 ? (rows + 127) / 128 : rows;
  return rows * quant_code_row_bytes(format, cols) +
         scale_rows * ((cols + group - 1) / group) * quant_scale_bytes(format);
}

int64_t QuantMatrix::bytes() const {
  return rows * quant_code_row_bytes(format, cols) +
         scale_rows() * scale_cols() * quant_scale_bytes(format);
}

QuantMatrix QuantMatrix::slice(int64_t e, int64_t code_bytes_per_matrix,
                               int64_t scales_per_matrix) const {
  QuantMatrix m = *this;
  m.codes = codes + e * code_bytes_per_matrix;
  m.scales = static_cast<const char*>(scales) + e * scales_per_matrix * quant_scale_bytes(format);
  return m;
}

void check_quant_matrix(const QuantMatrix& q, std::string_view what) {
  const std::string name(what);
  const std::string fmt(quant_format_name(q.format));
  TIERMOE_CHECK(q.codes && q.scales && q.rows > 0 && q.cols > 0,
                str_of("the ", fmt, " matrix has no codes, scales or shape"), name,
                "bind a matrix read from a checkpoint or made by quantize_int");
  const int64_t want_group = q.format == QuantFormat::mxfp4 ? 32
                             : q.format == QuantFormat::fp8 ? 128
                                                            : q.group;
  TIERMOE_CHECK(q.group > 0 && q.group == want_group,
                str_of("the ", fmt, " matrix has ", q.group, " columns per scale",
                       q.group != want_group ? str_of(", the format has ", want_group) : ""),
                name, "int4/int8 groups are positive; mxfp4 blocks are 32, fp8 blocks 128");
  const bool rows_ok = q.row_group == 1 || (q.format == QuantFormat::fp8 && q.row_group == 128);
  TIERMOE_CHECK(rows_ok, str_of("the ", fmt, " matrix has ", q.row_group, " rows per scale"), name,
                "fp8 blocks are 128 rows (1 once stacked off a block edge); other formats 1");
  TIERMOE_CHECK(
      q.code_stride >= quant_code_row_bytes(q.format, q.cols) && q.scale_stride >= q.scale_cols(),
      str_of("the ", fmt, " matrix [", q.rows, ", ", q.cols, "] has rows of ", q.code_stride,
             " code bytes and ", q.scale_stride, " scales; it needs ",
             quant_code_row_bytes(q.format, q.cols), " and ", q.scale_cols()),
      name, "check the codes' and scales' shapes against the matrix's");
}

void dequantize_row(const QuantMatrix& q, int64_t row, int64_t c0, int64_t n, float* out) {
  const uint8_t* codes = q.codes + row * q.code_stride;
  switch (q.format) {
    case QuantFormat::int4:
    case QuantFormat::int8: {
      const float* scales = static_cast<const float*>(q.scales) + row * q.scale_stride;
      const bool nibbles = q.format == QuantFormat::int4;
      for (int64_t c = c0; c < c0 + n;) {
        // One group's run at a time: a single scale, a loop that vectorizes.
        const int64_t end = std::min(c0 + n, (c / q.group + 1) * q.group);
        const float s = scales[c / q.group];
        float* o = out + (c - c0);
        if (nibbles) {
          int64_t i = c;
          if (i & 1) *o++ = float(int(codes[i / 2] >> 4) - 8) * s, ++i;
          const uint8_t* b = codes + i / 2;
          const int64_t pairs = (end - i) / 2;
          for (int64_t p = 0; p < pairs; ++p) {
            o[2 * p] = float(int(b[p] & 15) - 8) * s;
            o[2 * p + 1] = float(int(b[p] >> 4) - 8) * s;
          }
          if ((end - i) & 1) o[2 * pairs] = float(int(b[pairs] & 15) - 8) * s;
        } else {
          const int8_t* b = reinterpret_cast<const int8_t*>(codes) + c;
          for (int64_t i = 0; i < end - c; ++i) o[i] = float(b[i]) * s;
        }
        c = end;
      }
      if (q.bf16_values) {
        for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(float_to_bf16(out[i]));
      }
      return;
    }
    case QuantFormat::mxfp4:
    case QuantFormat::fp8:
      for (int64_t c = c0; c < c0 + n; ++c) out[c - c0] = element(q, row, c);
      return;
  }
}

Tensor dequantize(const QuantMatrix& q, DType dt, MemTag tag) {
  check_quant_matrix(q, "dequantize");
  Tensor out = Tensor::empty({q.rows, q.cols}, dt, tag);
  visit_dtype(dt, [&]<class T>() {
    T* dst = out.data<T>();
    parallel_for(q.rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = 0; c < q.cols; ++c) {
          const float v = element(q, r, c);
          if constexpr (std::is_same_v<T, bf16>) dst[r * q.cols + c] = float_to_bf16(v);
          else dst[r * q.cols + c] = T(v);
        }
      }
    });
  });
  return out;
}

QuantMatrix quantize_int(const Tensor& w_NK, QuantFormat format, int64_t group, MemTag tag) {
  TIERMOE_CHECK(format == QuantFormat::int4 || format == QuantFormat::int8,
                str_of("quantize_int makes int4 or int8, not ", quant_format_name(format)),
                "quantize_int", "mxfp4 and fp8 are read from checkpoints as shipped");
  TIERMOE_CHECK(w_NK.defined() && w_NK.dim() == 2 && group > 0,
                str_of("quantize_int needs a 2-D weight and a positive group, got ",
                       w_NK.defined() ? w_NK.str() : std::string("undefined"), " and group ", group),
                "quantize_int", "pass one [out, in] matrix");
  const int64_t N = w_NK.size(0), K = w_NK.size(1);
  const bool int4 = format == QuantFormat::int4;
  const int qmin = int4 ? -8 : -128, qmax = int4 ? 7 : 127;
  const float half_range = float(qmax - qmin) / 2.f;
  QuantBuffer buf = alloc_quant_matrix(format, N, K, group, 1, tag);
  buf.matrix.bf16_values = true;
  const QuantMatrix& q = buf.matrix;
  uint8_t* codes = buf.codes;
  float* scales = static_cast<float*>(buf.scales);
  // Row by row as f32 (an f64 weight rounded to f32 first), each group's
  // loops plain enough to vectorize.
  parallel_for(N, 4, [&](int64_t r0, int64_t r1) {
    std::vector<float> x(static_cast<size_t>(K));
    std::vector<int32_t> v(static_cast<size_t>(group));
    for (int64_t r = r0; r < r1; ++r) {
      visit_dtype(w_NK.dtype(), [&]<class T>() {
        const T* src = w_NK.data<T>() + r * K;
        for (int64_t c = 0; c < K; ++c) x[size_t(c)] = float(load<T>(src[c]));
      });
      uint8_t* row = codes + r * q.code_stride;
      for (int64_t g = 0; g < q.scale_stride; ++g) {
        const int64_t c0 = g * group, n = std::min(K, c0 + group) - c0;
        const float* xg = x.data() + c0;
        float amax = 0;
        for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::abs(xg[i]));
        float s = bf16_to_float(float_to_bf16(float(double(amax) / double(half_range))));
        if (s == 0.f) s = bf16_to_float(bf16{1});  // the smallest positive bf16
        scales[r * q.scale_stride + g] = s;
        for (int64_t i = 0; i < n; ++i) {
          v[size_t(i)] = std::clamp(int32_t(__builtin_nearbyintf(xg[i] / s)), qmin, qmax);
        }
        if (int4 && c0 % 2 == 0) {
          // Two codes a byte, the first in the low nibble; an odd tail's
          // last code alone.
          uint8_t* b = row + c0 / 2;
          for (int64_t i = 0; i + 1 < n; i += 2) {
            b[i / 2] = uint8_t((v[size_t(i)] + 8) | ((v[size_t(i) + 1] + 8) << 4));
          }
          if (n % 2) b[n / 2] = uint8_t(v[size_t(n) - 1] + 8);
        } else if (int4) {  // an odd group: nibbles one at a time
          for (int64_t i = 0; i < n; ++i) {
            const int64_t c = c0 + i;
            row[c / 2] |= uint8_t((v[size_t(i)] + 8) << ((c & 1) * 4));
          }
        } else {
          for (int64_t i = 0; i < n; ++i) row[c0 + i] = uint8_t(int8_t(v[size_t(i)]));
        }
      }
    }
  });
  return buf.matrix;
}

namespace {

// The E2M1 code (0..7) nearest magnitude m >= 0, ties to the even code,
// saturating at 6 (code 7).
uint8_t nearest_e2m1(float m) {
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; ++c) {
    const float d = std::abs(kE2m1Values[c] - m), b = std::abs(kE2m1Values[best] - m);
    if (d < b || (d == b && c % 2 == 0)) best = c;
  }
  return best;
}

}  // namespace

QuantMatrix quantize_mxfp4(const Tensor& w_NK, MemTag tag) {
  TIERMOE_CHECK(w_NK.defined() && w_NK.dim() == 2 && w_NK.size(1) % 32 == 0,
                str_of("quantize_mxfp4 needs a 2-D weight of whole 32-column blocks, got ",
                       w_NK.defined() ? w_NK.str() : std::string("undefined")),
                "quantize_mxfp4", "MXFP4 blocks are 32 input columns");
  const int64_t N = w_NK.size(0), K = w_NK.size(1);
  QuantBuffer buf = alloc_quant_matrix(QuantFormat::mxfp4, N, K, 32, 1, tag);
  const QuantMatrix& q = buf.matrix;
  uint8_t* exps = static_cast<uint8_t*>(buf.scales);
  parallel_for(N, 4, [&](int64_t r0, int64_t r1) {
    std::vector<float> x(static_cast<size_t>(K));
    for (int64_t r = r0; r < r1; ++r) {
      visit_dtype(w_NK.dtype(), [&]<class T>() {
        const T* src = w_NK.data<T>() + r * K;
        for (int64_t c = 0; c < K; ++c) x[size_t(c)] = float(load<T>(src[c]));
      });
      for (int64_t g = 0; g < K / 32; ++g) {
        const float* xg = x.data() + g * 32;
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::abs(xg[i]));
        int k = 0;
        std::frexp(amax, &k);  // amax = f 2^k, f in [0.5, 1): floor(log2 amax) = k - 1
        const int biased = amax == 0 ? 0 : std::clamp(k - 3 + 127, 0, 254);
        exps[r * q.scale_stride + g] = uint8_t(biased);
        uint8_t* b = buf.codes + r * q.code_stride + g * 16;
        for (int i = 0; i < 32; ++i) {
          const float m = std::ldexp(std::abs(xg[i]), 127 - biased);
          const uint8_t code = uint8_t(nearest_e2m1(m) | (std::signbit(xg[i]) ? 8 : 0));
          b[i / 2] = uint8_t(b[i / 2] | (code << ((i & 1) * 4)));
        }
      }
    }
  });
  return buf.matrix;
}

QuantBuffer alloc_quant_matrix(QuantFormat format, int64_t rows, int64_t cols, int64_t group,
                               int64_t row_group, MemTag tag) {
  QuantMatrix q;
  q.format = format;
  q.rows = rows, q.cols = cols, q.group = group, q.row_group = row_group;
  q.code_stride = quant_code_row_bytes(format, cols);
  q.scale_stride = q.scale_cols();
  // Tracked storage for raw bytes: f32 tensors of enough elements.
  struct Owned {
    Tensor codes, scales;
  };
  auto owned = std::make_shared<Owned>();
  owned->codes = Tensor::zeros({(rows * q.code_stride + 3) / 4}, DType::f32, tag);
  owned->scales = Tensor::zeros(
      {(q.scale_rows() * q.scale_stride * quant_scale_bytes(format) + 3) / 4}, DType::f32, tag);
  QuantBuffer buf;
  buf.codes = static_cast<uint8_t*>(owned->codes.raw());
  buf.scales = owned->scales.raw();
  q.codes = buf.codes;
  q.scales = buf.scales;
  q.owner = std::move(owned);
  buf.matrix = q;
  return buf;
}

QuantMatrix stack_quant_rows(const std::vector<QuantMatrix>& parts, MemTag tag) {
  TIERMOE_CHECK(!parts.empty(), "no matrices to stack", "stack_quant_rows", "pass one or more");
  const QuantMatrix& p0 = parts[0];
  int64_t rows = 0;
  bool whole_blocks = true;  // every part but the last ends on a row block
  for (size_t i = 0; i < parts.size(); ++i) {
    const QuantMatrix& p = parts[i];
    check_quant_matrix(p, "stack_quant_rows");
    TIERMOE_CHECK(p.format == p0.format && p.cols == p0.cols && p.group == p0.group &&
                      p.bf16_values == p0.bf16_values,
                  str_of("stacking a ", quant_format_name(p.format), " [", p.rows, ", ", p.cols,
                         "] group ", p.group, " matrix under a ", quant_format_name(p0.format),
                         " [", p0.rows, ", ", p0.cols, "] group ", p0.group, " one"),
                  "stack_quant_rows", "stacked matrices share their format, width and group");
    whole_blocks = whole_blocks && (i + 1 == parts.size() || p.rows % p.row_group == 0) &&
                   p.row_group == p0.row_group;
    rows += p.rows;
  }
  QuantBuffer out =
      alloc_quant_matrix(p0.format, rows, p0.cols, p0.group, whole_blocks ? p0.row_group : 1, tag);
  out.matrix.bf16_values = p0.bf16_values;
  const QuantMatrix& q = out.matrix;
  const int64_t row_bytes = quant_code_row_bytes(q.format, q.cols);
  const int64_t sb = quant_scale_bytes(q.format), scale_row_bytes = q.scale_stride * sb;
  int64_t r0 = 0;
  for (const QuantMatrix& p : parts) {
    for (int64_t r = 0; r < p.rows; ++r) {
      std::memcpy(out.codes + (r0 + r) * q.code_stride, p.codes + r * p.code_stride,
                  size_t(row_bytes));
    }
    // A scale row per row of q's (r0 is a block edge when q keeps blocks).
    for (int64_t r = 0; r < p.rows; r += q.row_group) {
      std::memcpy(static_cast<char*>(out.scales) + ((r0 + r) / q.row_group) * scale_row_bytes,
                  static_cast<const char*>(p.scales) + (r / p.row_group) * p.scale_stride * sb,
                  size_t(scale_row_bytes));
    }
    r0 += p.rows;
  }
  return q;
}

}  // namespace tiermoe
