#pragma once
// A GEMM microkernel: one ISA's register (or tile) block of C, and the packed
// layouts of its A and B operands. The driver (driver.h) blocks a product
// into these; pack.h writes the layouts.
//
// This header holds declarations only: the real-ISA translation units,
// compiled with -mavx512* / -mamx-*, include it, and an inline function
// compiled there could be the copy the linker keeps for everyone.
//
// Row invariance by construction: a microkernel always computes its whole
// mr x nr block over the same kc (rows past M and columns past N are zero
// padding in the packed operands), and each element of C is one fixed chain
// of instructions over k in order, so a row's bits never depend on M, on
// where the row sits in the block, on the blocking or on the thread count.
// Splitting K into kc blocks stores and reloads the f32 sums exactly.
#include <cstdint>

#include "tiermoe/core/dtype.h"
#include "tiermoe/kernels/cpu_isa.h"

namespace tiermoe::cpu::gemm {

// Packed A, one micro-panel of mr rows x kc (kc a multiple of k_step):
//   f32_kmajor  float [kc][mr]        (bf16 sources widened exactly)
//   bf16_pairs  bf16 [kc/2][mr][2]    (a dword holds k = 2p, 2p+1 of one row)
//   bf16_tiles  bf16 [kc/32][mr][32]  (per 32 values of k, the rows as AMX
//                                     tiles load them: one tile of 16 rows
//                                     is 1 KB in one run)
// Every layout is k-major at its coarsest, so the panels of consecutive kc
// blocks, stored one after the other, are the panel over their whole K: the
// driver runs a memory-bound block through all of K in one call that way.
enum class APack : uint8_t { f32_kmajor, bf16_pairs, bf16_tiles };

// Packed B, one panel of nr columns x kc:
//   f32         float [kc][nr]
//   bf16_split  u32 [kc][nr/2]: dword d holds column d (low half) and column
//               d + nr/2 (high half), so a shift and a mask widen one load
//               into two f32 vectors of consecutive columns
//   bf16_pairs  bf16 [kc/2][nr][2]: a dword holds k = 2p, 2p+1 of one column
//               (VNNI order: vdpbf16ps operands, AMX B tiles)
// A panel for all of K is the concatenation of its kc blocks, so a packed
// weight serves any kc block at b_offset().
enum class BPack : uint8_t { f32, bf16_split, bf16_pairs };

struct Microkernel {
  CpuIsa isa = CpuIsa::avx2;
  DType in = DType::f32;  // dtype of A and B
  int mr = 0, nr = 0;     // the block of C
  // Rows of A that share one pass over B (the driver's mc, rounded up to
  // mr). B, when prepacked, is a weight read from memory once per such
  // block, so a kernel that multiplies faster needs taller blocks: AMX's
  // 256 rows ask about 14 GB/s of weight per core at its peak, where 96 would
  // ask 36 (measured: W2 at 256 rows per expert, 18% -> 23% of the AMX peak).
  int mc = 96;
  int k_step = 1;         // K is zero-padded to a multiple of this
  APack a = APack::f32_kmajor;
  BPack b = BPack::f32;
  // c[i * ldc + j] = (load_c ? c[i * ldc + j] : 0) + sum over k < kc of
  // A(i, k) B(k, j), for the whole mr x nr block; c is f32.
  void (*run)(int64_t kc, const void* a, const void* b, float* c, int64_t ldc,
              bool load_c) = nullptr;
  // Per-thread set-up and tear-down around a series of run() calls (the AMX
  // tile configuration); null when the ISA needs none.
  void (*thread_begin)() = nullptr;
  void (*thread_end)() = nullptr;
  // The ISA's multiply-add instruction in a register-only loop of `reps`
  // rounds (peak_loops.h); returns the flops done. Null for the emulations.
  int64_t (*peak)(int64_t reps) = nullptr;
};

// The microkernel of `isa` for inputs of dtype `in` (f32 or bf16). onednn
// has none (Error).
const Microkernel& microkernel(CpuIsa isa, DType in);

// The tables each ISA's translation unit defines.
const Microkernel* avx2_microkernels();            // isa_avx2.cpp: {f32, bf16}
const Microkernel* avx512_microkernels();          // isa_avx512.cpp: {f32, bf16}
const Microkernel* avx512bf16_microkernels();      // isa_avx512bf16.cpp: {bf16}
const Microkernel* amx_microkernels();             // isa_amx.cpp: {bf16}
const Microkernel* emulated_microkernels(CpuIsa);  // isa_emu.cpp: {f32, bf16}

}  // namespace tiermoe::cpu::gemm
