#pragma once
// The FMA microkernels (avx2, avx512, and avx512-emu): broadcast one value of
// A, multiply-add it into nr columns of C from packed B. Each element of C is
// one chain acc = fma(a_k, b_k, acc) for k = 0, 1, ..., kc-1 starting from 0
// (or the stored partial sum), so
//  - every ISA that runs these kernels gives the same bits, whatever its
//    vector width (avx2 == avx512 == avx512-emu, tested);
//  - a bf16 operand widened to f32 (exact) gives the bits of the f32 kernel
//    on the widened values;
//  - appending zero rows to a dW reduction adds fma(0, x, acc) = acc: the sum
//    starts at +0, never -0, so the bits stay.
//
// Templates over an ISA wrapper V (ops_avx2.h, ops_avx512.h,
// ops_avx512_emu.h) with:
//   V::F, V::kLanes        a vector of kLanes floats
//   V::I                   a vector of kLanes dwords
//   V::zero(), load(p), store(p, v), broadcast(p), fma(a, b, c) = a * b + c
//   V::load_u32(p)         kLanes dwords
//   V::bf16_lo(w), bf16_hi(w)   the low / high bf16 halves of each dword,
//                               widened to f32 (exact)
// Everything here is a template over V, so each instantiation has the
// internal linkage of its wrapper type (see microkernel.h).
#include <cstdint>

#include "unroll.h"

namespace tiermoe::cpu::gemm {

// C[MR x NV*kLanes] (+)= A . B with A packed f32_kmajor, B packed f32.
template <class V, int MR, int NV>
void fma_f32(int64_t kc, const void* a_, const void* b_, float* c, int64_t ldc, bool load_c) {
  using F = typename V::F;
  constexpr int L = V::kLanes, NR = NV * L;
  const float* a = static_cast<const float*>(a_);
  const float* b = static_cast<const float*>(b_);
  F acc[MR][NV];
  unroll<MR>([&](auto r) {
    unroll<NV>([&](auto v) { acc[r][v] = load_c ? V::load(c + r * ldc + v * L) : V::zero(); });
  });
  for (int64_t k = 0; k < kc; ++k) {
    F bv[NV];
    unroll<NV>([&](auto v) { bv[v] = V::load(b + k * NR + v * L); });
    unroll<MR>([&](auto r) {
      const F av = V::broadcast(a + k * MR + r);
      unroll<NV>([&](auto v) { acc[r][v] = V::fma(av, bv[v], acc[r][v]); });
    });
  }
  unroll<MR>(
      [&](auto r) { unroll<NV>([&](auto v) { V::store(c + r * ldc + v * L, acc[r][v]); }); });
}

// The same chains for bf16 inputs: A packed f32_kmajor (widened), B packed
// bf16_split and widened in registers, so B stays half the bytes of f32.
template <class V, int MR, int NV>
void fma_bf16(int64_t kc, const void* a_, const void* b_, float* c, int64_t ldc, bool load_c) {
  static_assert(NV % 2 == 0, "bf16_split pairs column d with d + nr/2");
  using F = typename V::F;
  constexpr int L = V::kLanes, H = NV / 2, NR = NV * L;
  const float* a = static_cast<const float*>(a_);
  const uint32_t* b = static_cast<const uint32_t*>(b_);
  F acc[MR][NV];
  unroll<MR>([&](auto r) {
    unroll<NV>([&](auto v) { acc[r][v] = load_c ? V::load(c + r * ldc + v * L) : V::zero(); });
  });
  for (int64_t k = 0; k < kc; ++k) {
    typename V::I w[H];
    unroll<H>([&](auto v) { w[v] = V::load_u32(b + k * (NR / 2) + v * L); });
    unroll<MR>([&](auto r) {
      const F av = V::broadcast(a + k * MR + r);
      // Widened where used (the compiler shares them across rows): writing
      // them to an array first makes GCC 12 spill the accumulators.
      unroll<NV>([&](auto v) {
        F bv;
        if constexpr (v < H) {
          bv = V::bf16_lo(w[v]);
        } else {
          bv = V::bf16_hi(w[v - H]);
        }
        acc[r][v] = V::fma(av, bv, acc[r][v]);
      });
    });
  }
  unroll<MR>(
      [&](auto r) { unroll<NV>([&](auto v) { V::store(c + r * ldc + v * L, acc[r][v]); }); });
}

}  // namespace tiermoe::cpu::gemm
