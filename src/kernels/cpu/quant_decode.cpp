// The bf16 products' expansion of stored matrices (kernels/quant.h): a row
// segment decoded and rounded to bf16 in AVX2 vectors, the value of each
// element exactly float_to_bf16 of dequantize_row's. The nibble formats
// (int4, MXFP4) have 16 values per scale, so each group's 16 rounded values
// are tabulated once and the codes looked up 32 at a time with byte
// shuffles; int8 and FP8 convert 8 codes per vector.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "bf16_avx2.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {
namespace {

using cpu::round8_bf16;

// Two vectors of eight rounded values (each in its dword's low half) as 16
// bf16 in order.
__m256i narrow16(__m256i lo, __m256i hi) {
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
}

// A group's 16 values, rounded, split into their low and high bytes (the
// tables the shuffles read).
struct NibbleTable {
  __m128i lo, hi;
  uint16_t v[16];
};

NibbleTable nibble_table(QuantFormat f, const void* scales, int64_t s) {
  float vals[16];
  if (f == QuantFormat::int4) {
    const float scale = static_cast<const float*>(scales)[s];
    for (int c = 0; c < 16; ++c) vals[c] = float(c - 8) * scale;
  } else {  // mxfp4: ldexp's value, by one product where 2^(e - 127) is a float
    const uint32_t e = static_cast<const uint8_t*>(scales)[s];
    if (e == 255) {
      for (int c = 0; c < 16; ++c) vals[c] = std::ldexp(kE2m1Values[c], 128);
    } else {
      const float p2 = std::bit_cast<float>(e == 0 ? 0x00400000u : e << 23);
      for (int c = 0; c < 16; ++c) vals[c] = kE2m1Values[c] * p2;
    }
  }
  NibbleTable t;
  const __m256i r = narrow16(round8_bf16(_mm256_loadu_ps(vals)), round8_bf16(_mm256_loadu_ps(vals + 8)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.v), r);
  // Low bytes of the 16 words, then high bytes.
  const __m256i split = _mm256_shuffle_epi8(
      r, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                          12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m128i a = _mm256_castsi256_si128(split), b = _mm256_extracti128_si256(split, 1);
  t.lo = _mm_unpacklo_epi64(a, b);
  t.hi = _mm_unpackhi_epi64(a, b);
  return t;
}

// 32 elements from 16 bytes of nibbles (element 2i low, 2i + 1 high).
void lookup32(const NibbleTable& t, const uint8_t* codes, uint16_t* out) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
  const __m128i m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  const __m128i idx[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)};
  for (int h = 0; h < 2; ++h) {
    const __m128i l = _mm_shuffle_epi8(t.lo, idx[h]), u = _mm_shuffle_epi8(t.hi, idx[h]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * h), _mm_unpacklo_epi8(l, u));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * h + 8), _mm_unpackhi_epi8(l, u));
  }
}

void nibbles(const QuantMatrix& q, int64_t row, int64_t c0, int64_t n, uint16_t* out) {
  const uint8_t* codes = q.codes + row * q.code_stride;
  const char* scales = static_cast<const char*>(q.scales) +
                       row * q.scale_stride * (q.format == QuantFormat::mxfp4 ? 1 : 4);
  for (int64_t c = c0; c < c0 + n;) {
    const int64_t end = std::min(c0 + n, (c / q.group + 1) * q.group);
    const NibbleTable t = nibble_table(q.format, scales, c / q.group);
    for (; c < end && (c & 1); ++c) out[c - c0] = t.v[codes[c / 2] >> 4];
    for (; c + 32 <= end; c += 32) lookup32(t, codes + c / 2, out + (c - c0));
    for (; c < end; ++c) out[c - c0] = t.v[(c & 1) ? codes[c / 2] >> 4 : codes[c / 2] & 15];
  }
}

// Eight int8 codes times a scale.
__m256 int8_values(const uint8_t* codes, __m256 scale) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), scale);
}

// Eight float8_e4m3fn codes times a scale: the magnitude's bits moved into
// an f32 with the exponent rebiased (exact for normals); subnormal codes
// (exponent 0) come out as 2^-7 + m 2^-10 and are mapped to m 2^-9; the
// NaN codes to a quiet NaN; the sign put back.
__m256 fp8_values(const uint8_t* codes, __m256 scale) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
  __m256 v = _mm256_castsi256_ps(
      _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag));
  const __m256 fixed = _mm256_mul_ps(_mm256_sub_ps(v, _mm256_set1_ps(0x1p-7f)), _mm256_set1_ps(2.f));
  v = _mm256_blendv_ps(v, fixed, sub);
  const __m256 nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f)));
  v = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), nan);
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
  v = _mm256_or_ps(v, _mm256_castsi256_ps(sign));
  return _mm256_mul_ps(v, scale);
}

void bytes(const QuantMatrix& q, int64_t row, int64_t c0, int64_t n, uint16_t* out) {
  const uint8_t* codes = q.codes + row * q.code_stride;
  const float* scales = static_cast<const float*>(q.scales) + (row / q.row_group) * q.scale_stride;
  const bool fp8 = q.format == QuantFormat::fp8;
  float tail[16];
  for (int64_t c = c0; c < c0 + n;) {
    const int64_t end = std::min(c0 + n, (c / q.group + 1) * q.group);
    const __m256 s = _mm256_set1_ps(scales[c / q.group]);
    for (; c + 16 <= end; c += 16) {
      const __m256 a = fp8 ? fp8_values(codes + c, s) : int8_values(codes + c, s);
      const __m256 b = fp8 ? fp8_values(codes + c + 8, s) : int8_values(codes + c + 8, s);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (c - c0)),
                          narrow16(round8_bf16(a), round8_bf16(b)));
    }
    if (c < end) {
      dequantize_row(q, row, c, end - c, tail);
      for (int64_t i = 0; i < end - c; ++i) out[c - c0 + i] = float_to_bf16(tail[i]).bits;
      c = end;
    }
  }
}

}  // namespace

void dequantize_row_bf16(const QuantMatrix& q, int64_t row, int64_t c0, int64_t n, bf16* out) {
  static_assert(sizeof(bf16) == 2);
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  if (q.format == QuantFormat::int4 || q.format == QuantFormat::mxfp4) {
    nibbles(q, row, c0, n, o);
  } else {
    bytes(q, row, c0, n, o);
  }
}

}  // namespace tiermoe
