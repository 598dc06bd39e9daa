#pragma once
// The AVX-512F wrapper of kernel_fma.h: one line per intrinsic. Only for a
// translation unit compiled with -mavx512f (isa_avx512.cpp).
#include <immintrin.h>

#include <cstdint>

namespace tiermoe::cpu::gemm {
namespace {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static I load_u32(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static F bf16_lo(I w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
  static F bf16_hi(I w) {
    return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(-65536)));
  }
};

}  // namespace
}  // namespace tiermoe::cpu::gemm
