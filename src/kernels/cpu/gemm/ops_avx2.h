#pragma once
// The AVX2 + FMA wrapper of kernel_fma.h: one line per intrinsic. x86-64-v3
// is the build's baseline, so this needs no extra compiler flags.
#include <immintrin.h>

#include <cstdint>

namespace tiermoe::cpu::gemm {
namespace {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static I load_u32(const uint32_t* p) { return _mm256_loadu_si256(reinterpret_cast<const I*>(p)); }
  static F bf16_lo(I w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
  static F bf16_hi(I w) {
    return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(-65536)));
  }
};

}  // namespace
}  // namespace tiermoe::cpu::gemm
