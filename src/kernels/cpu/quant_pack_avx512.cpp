// Stored matrices straight into bf16-pair panels (quant_pack.h). Compiled
// with AVX-512 F and BW; called only where the CPU has them. Like the
// microkernels' files it uses intrinsics and builtins only, no inline
// library function whose AVX-512 copy the linker could keep for everyone.
#include <immintrin.h>

#include "quant_pack.h"
#include "tiermoe/kernels/cpu_features.h"

namespace tiermoe::cpu {
namespace {

// 16 floats rounded to bf16 as float_to_bf16 does (nearest even, NaN kept
// quiet), each in the low half of its dword.
__m512i round16_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_srli_epi32(r, 16);
}

// A scale group's 16 values rounded to bf16 (nearest even, NaN quiet, as
// float_to_bf16), as 16 words: the table vpermw reads.
__m512i table_of(const QuantMatrix& q, int64_t row, int64_t group) {
  __m512 v;
  if (q.format == QuantFormat::int4) {
    const float s = static_cast<const float*>(q.scales)[row * q.scale_stride + group];
    v = _mm512_mul_ps(_mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7),
                      _mm512_set1_ps(s));
  } else {  // mxfp4: ldexp's values (dequantize's definition)
    const uint32_t e = static_cast<const uint8_t*>(q.scales)[row * q.scale_stride + group];
    if (e == 255) {
      alignas(64) float vals[16];
      for (int c = 0; c < 16; ++c) vals[c] = __builtin_ldexpf(kE2m1Values[c], 128);
      v = _mm512_load_ps(vals);
    } else {
      const __m512i p2 = _mm512_set1_epi32(int(e == 0 ? 0x00400000u : e << 23));
      v = _mm512_mul_ps(_mm512_loadu_ps(kE2m1Values), _mm512_castsi512_ps(p2));
    }
  }
  return _mm512_castsi256_si512(_mm512_cvtepi32_epi16(round16_bf16(v)));
}

// 32 values (16 bytes of nibbles) as 16 dwords, each the pair (2i, 2i + 1)
// in VNNI order: the low nibble indexes the low word, the high one the high.
__m512i pairs_of(const uint8_t* codes, __m512i table) {
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512i idx =
      _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 12), _mm512_set1_epi32(0x000f000f), 0xa8);
  return _mm512_permutexvar_epi16(idx, table);
}

// 16 int8 codes, or float8_e4m3fn codes (the magnitude's bits moved into an
// f32 with the exponent rebiased, exact for normals; subnormal codes, which
// come out as 2^-7 + m 2^-10, mapped to m 2^-9; NaN codes to a quiet NaN;
// the sign put back), as floats.
__m512 int8_values(const uint8_t* codes) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
}
__m512 fp8_values(const uint8_t* codes) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
  __m512 v = _mm512_castsi512_ps(
      _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23)));
  const __mmask16 sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
  v = _mm512_mask_mul_ps(v, sub, _mm512_sub_ps(v, _mm512_set1_ps(0x1p-7f)), _mm512_set1_ps(2.f));
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7f));
  v = _mm512_mask_blend_ps(nan, v, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
}

// One row's scale group as the expansion reads it: the nibble formats' 16
// rounded values (a table), the byte formats' scale.
struct Group {
  __m512i table;
  __m512 scale;
};

Group group_of(const QuantMatrix& q, int64_t row, int64_t col) {
  const int64_t g = col / q.group;
  switch (q.format) {
    case QuantFormat::int4:
    case QuantFormat::mxfp4:
      return {table_of(q, row, g), _mm512_setzero_ps()};
    case QuantFormat::int8:
    case QuantFormat::fp8: {
      const float* scales = static_cast<const float*>(q.scales);
      return {_mm512_setzero_si512(),
              _mm512_set1_ps(scales[(row / q.row_group) * q.scale_stride + g])};
    }
  }
  __builtin_unreachable();
}

// Row `row`'s 32 values from column `col` (inside one group), rounded to
// bf16, as 32 words in column order: 16 dwords, each the pair (col + 2i,
// col + 2i + 1).
__m512i words_of(const QuantMatrix& q, int64_t row, int64_t col, const Group& g) {
  const uint8_t* codes = q.codes + row * q.code_stride;
  if (q.format == QuantFormat::int4 || q.format == QuantFormat::mxfp4) {
    return pairs_of(codes + col / 2, g.table);
  }
  const bool fp8 = q.format == QuantFormat::fp8;
  const __m512 a = fp8 ? fp8_values(codes + col) : int8_values(codes + col);
  const __m512 b = fp8 ? fp8_values(codes + col + 16) : int8_values(codes + col + 16);
  // The low words of a's 16 dwords, then b's: columns in order.
  const __m512i even = _mm512_setr_epi32(0x00020000, 0x00060004, 0x000a0008, 0x000e000c,
                                         0x00120010, 0x00160014, 0x001a0018, 0x001e001c,
                                         0x00220020, 0x00260024, 0x002a0028, 0x002e002c,
                                         0x00320030, 0x00360034, 0x003a0038, 0x003e003c);
  return _mm512_permutex2var_epi16(round16_bf16(_mm512_mul_ps(a, g.scale)), even,
                                   round16_bf16(_mm512_mul_ps(b, g.scale)));
}

// r[i] (16 rows of 16 dwords) transposed in place: r[j] holds dword j of
// every row.
void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  __m512i u[16];  // u[i + c], lane L: dword 4L + c of rows i..i+3
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
  }
}

}  // namespace

bool pairs_apply(const QuantMatrix& q, int64_t k0, int64_t kk, int64_t nr) {
  return q.group % 32 == 0 && k0 % 32 == 0 && kk % 32 == 0 && nr % 16 == 0 && has_avx512bw();
}

void pack_pairs(const QuantMatrix& q, int64_t first, int64_t valid, int64_t k0, int64_t kk,
                       int64_t kc, int64_t nr, void* dst_v) {
  auto* dst = static_cast<int32_t*>(dst_v);  // [kc/2][nr]
  for (int64_t x0 = 0; x0 < nr; x0 += 16) {
    const int64_t left = valid - x0;
    const int rows = left <= 0 ? 0 : left >= 16 ? 16 : int(left);
    Group group[16];
    for (int64_t k = k0; k < k0 + kk; k += 32) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        if (i >= rows) {
          r[i] = _mm512_setzero_si512();
          continue;
        }
        const int64_t row = first + x0 + i;
        if (k == k0 || k % q.group == 0) group[i] = group_of(q, row, k);
        r[i] = words_of(q, row, k, group[i]);
      }
      transpose16(r);
      int32_t* out = dst + ((k - k0) / 2) * nr + x0;
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(out + j * nr, r[j]);
    }
    for (int64_t p = kk / 2; p < kc / 2; ++p) {
      _mm512_storeu_si512(dst + p * nr + x0, _mm512_setzero_si512());
    }
  }
}

bool pairs_dx_apply(const QuantMatrix& q, int64_t j0, int64_t width, int64_t nr) {
  return q.group % 32 == 0 && j0 % 32 == 0 && width % 32 == 0 && nr % 32 == 0 &&
         width % nr == 0 && has_avx512bw();
}

void pack_pairs_dx(const QuantMatrix& q, int64_t k0, int64_t kk, int64_t kc, int64_t j0,
                          int64_t width, int64_t nr, void* dst_v) {
  auto* dst = static_cast<int32_t*>(dst_v);
  const int64_t panel_dwords = kc / 2 * nr;
  for (int64_t k = k0; k < k0 + kk; k += 2) {
    const bool second = k + 1 < k0 + kk;
    const int64_t p = (k - k0) / 2;
    Group group[2];
    for (int64_t c = j0; c < j0 + width; c += 32) {
      if (c == j0 || c % q.group == 0) {
        group[0] = group_of(q, k, c);
        if (second) group[1] = group_of(q, k + 1, c);
      }
      // Rows k and k + 1 over columns [c, c + 32), in order, 16 bf16 pairs
      // of columns each; interleaved into (k, k + 1) pairs per column.
      const __m512i a = words_of(q, k, c, group[0]);
      const __m512i b = second ? words_of(q, k + 1, c, group[1]) : _mm512_setzero_si512();
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      const __m512i t0 = _mm512_shuffle_i32x4(lo, hi, 0x44), t1 = _mm512_shuffle_i32x4(lo, hi, 0xee);
      const int64_t x = c - j0;
      int32_t* out = dst + (x / nr) * panel_dwords + p * nr + x % nr;
      _mm512_storeu_si512(out, _mm512_shuffle_i32x4(t0, t0, 0xd8));
      _mm512_storeu_si512(out + 16, _mm512_shuffle_i32x4(t1, t1, 0xd8));
    }
  }
  for (int64_t p = (kk + 1) / 2; p < kc / 2; ++p) {
    for (int64_t x = 0; x < width; x += 16) {
      _mm512_storeu_si512(dst + (x / nr) * panel_dwords + p * nr + x % nr, _mm512_setzero_si512());
    }
  }
}

}  // namespace tiermoe::cpu
