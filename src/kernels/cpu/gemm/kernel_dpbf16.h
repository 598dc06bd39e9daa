#pragma once
// The vdpbf16ps microkernel (avx512bf16, and avx512bf16-emu): broadcast one
// bf16 pair of A (k = 2p, 2p+1 of one row), multiply it with the pairs of nr
// columns of B and accumulate in f32. Each element of C is the chain, over
// p = 0, 1, ..., kc/2-1, of one VDPBF16PS step: acc += a[2p+1] b[2p+1], then
// acc += a[2p] b[2p] (each rounded, DAZ/FTZ, as the SDM writes it), so its
// bits depend on nothing but its row of A and its column of B. An odd K is
// padded with a zero pair member, which adds +-0 to a sum that starts at +0
// and never is -0.
//
// A template over an ISA wrapper V (ops_avx512bf16.h, ops_avx512_emu.h):
//   V::F, V::I, V::kLanes   kLanes floats / kLanes dwords
//   V::zero(), load(p), store(p, v), load_u32(p), broadcast_u32(p)
//   V::dpbf16(acc, a, b)    one VDPBF16PS
#include <cstdint>

#include "unroll.h"

namespace tiermoe::cpu::gemm {

// C[MR x NV*kLanes] (+)= A . B with A packed bf16_pairs, B packed bf16_pairs.
template <class V, int MR, int NV>
void dpbf16_kernel(int64_t kc, const void* a_, const void* b_, float* c, int64_t ldc, bool load_c) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int L = V::kLanes, NR = NV * L;
  const uint32_t* a = static_cast<const uint32_t*>(a_);
  const uint32_t* b = static_cast<const uint32_t*>(b_);
  F acc[MR][NV];
  unroll<MR>([&](auto r) {
    unroll<NV>([&](auto v) { acc[r][v] = load_c ? V::load(c + r * ldc + v * L) : V::zero(); });
  });
  for (int64_t p = 0; p < kc / 2; ++p) {
    I bv[NV];
    unroll<NV>([&](auto v) { bv[v] = V::load_u32(b + p * NR + v * L); });
    unroll<MR>([&](auto r) {
      const I av = V::broadcast_u32(a + p * MR + r);
      unroll<NV>([&](auto v) { acc[r][v] = V::dpbf16(acc[r][v], av, bv[v]); });
    });
  }
  unroll<MR>(
      [&](auto r) { unroll<NV>([&](auto v) { V::store(c + r * ldc + v * L, acc[r][v]); }); });
}

}  // namespace tiermoe::cpu::gemm
