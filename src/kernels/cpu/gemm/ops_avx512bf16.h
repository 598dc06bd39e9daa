#pragma once
// The AVX-512 BF16 wrapper of kernel_dpbf16.h: one line per intrinsic. Only
// for a translation unit compiled with -mavx512f -mavx512bf16
// (isa_avx512bf16.cpp).
#include <immintrin.h>

#include <cstdint>

namespace tiermoe::cpu::gemm {
namespace {

struct Avx512Bf16 {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static I load_u32(const uint32_t* p) { return _mm512_loadu_si512(p); }
  static I broadcast_u32(const uint32_t* p) { return _mm512_set1_epi32(int32_t(*p)); }
  // VDPBF16PS acc, a, b: acc += a.odd * b.odd, then += a.even * b.even, per dword.
  static F dpbf16(F acc, I a, I b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
};

}  // namespace
}  // namespace tiermoe::cpu::gemm
