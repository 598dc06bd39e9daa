#pragma once
// The AVX2 + FMA wrapper of kernel_fma.h: one line per intrinsic. x86-64-v3
// is the build's baseline, so this needs no extra compiler flags.
#include <immintrin.h>

#include <cstdint>

namespace tiermoe::cpu::gemm {
namespace {

struct Avx2 {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F zero() { return _mm256_setzero_ps(); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static void load_bf16_split(const uint32_t* p, F& lo, F& hi) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    hi = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int32_t(0xffff0000u))));
  }
};

}  // namespace
}  // namespace tiermoe::cpu::gemm
