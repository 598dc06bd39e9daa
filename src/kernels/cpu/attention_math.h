#pragma once
// Internal to the flash attention (attention.cpp): the row operations between
// its GEMMs, eight floats at a time on AVX2 (the build's x86-64-v3 baseline,
// so every ISA's attention runs these same instructions and gets the same
// bits from them).
#include <immintrin.h>

#include <cstdint>

namespace tiermoe::cpu::flash {

using F8 = __m256;

// exp(x) for f32, to about 2 ulps: x = n ln2 + r with n = round(x / ln2) and
// |r| <= ln2 / 2 (ln2 split in two, so the reduction loses nothing), then
// the Taylor series of e^r to degree 7 (its remainder r^8 / 8! < 6e-9
// relative, below half an f32 ulp) by Horner's rule in fused multiply-adds,
// times 2^n built in the exponent bits. x is clamped to [-87, 88], where 2^n
// stays a normal float: exp(-87) = 1.6e-38 stands in for anything smaller,
// which a probability never notices. A NaN stays NaN (maxps and minps return
// their second operand when one is NaN), so a bad input reaches the output
// where the non-finite guards see it. The FMAs are explicit (the build
// contracts nothing on its own), so every ISA's attention gets these bits.
inline F8 exp8(F8 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.f), _mm256_max_ps(_mm256_set1_ps(-87.f), x));
  // Round to nearest by the 1.5 * 2^23 trick: exact for |x / ln2| < 2^22.
  const F8 big = _mm256_set1_ps(12582912.f);
  const F8 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504f), big), big);
  F8 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606820309417e-06f), r);
  F8 p = _mm256_set1_ps(1.f / 5040);
  for (float c : {1.f / 720, 1.f / 120, 1.f / 24, 1.f / 6, 0.5f, 1.f, 1.f}) {
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  }
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// Rounds each float to bf16 (nearest even) and back: the cast a bf16 tensor
// would apply (finite inputs; scores are finite).
inline F8 round_bf16_8(F8 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(int(0xffff0000u))));
}

// Lanes c0 + 0..7 that lie in [lo, hi), as an all-ones mask.
inline F8 in_range(int64_t c0, int64_t lo, int64_t hi) {
  const __m256i c =
      _mm256_add_epi32(_mm256_set1_epi32(int(c0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i ge = _mm256_cmpgt_epi32(c, _mm256_set1_epi32(int(lo) - 1));
  const __m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32(int(hi)), c);
  return _mm256_castsi256_ps(_mm256_and_si256(ge, lt));
}

// Sum and max of the eight lanes, in a fixed order.
inline float hsum8(F8 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float hmax8(F8 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

}  // namespace tiermoe::cpu::flash
