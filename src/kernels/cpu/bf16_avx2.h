#pragma once
// bf16 rounding on AVX2 vectors (the x86-64-v3 baseline every TU has).
#include <immintrin.h>

namespace tiermoe::cpu {

// Eight floats rounded to bf16 as float_to_bf16 does (nearest even, NaN
// kept quiet), each in the low half of its dword.
inline __m256i round8_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
}

}  // namespace tiermoe::cpu
