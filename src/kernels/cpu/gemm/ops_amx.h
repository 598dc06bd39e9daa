#pragma once
// The AMX wrapper of kernel_amx.h: one instruction per function. Only for a
// translation unit compiled with -mamx-tile -mamx-bf16 (isa_amx.cpp). The
// tile register is part of each instruction's encoding, so it comes as a
// template argument printed into the instruction (%c: the bare constant);
// GCC 12's _tile_* macros stringify a literal and cannot take one.
#include <immintrin.h>

#include <cstdint>

#include "amx_config.h"

namespace tiermoe::cpu::gemm {
namespace {

struct Amx {
  // LDTILECFG [cfg]. Not GCC 12's _tile_loadconfig: its asm tells the
  // compiler it reads only the first 8 bytes, and the stores of the rows and
  // columns were dropped as dead (seen in the disassembly).
  static void load_config(const TileConfig* cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(*cfg)); }
  static void release() { _tile_release(); }  // TILERELEASE
  // TILELOADD tmm[T], [base + stride * row]
  template <int T>
  static void load(const void* base, int64_t stride) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(T) : "memory");
  }
  // TILESTORED [base + stride * row], tmm[T]
  template <int T>
  static void store(void* base, int64_t stride) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(T) : "memory");
  }
  // TILEZERO tmm[T]
  template <int T>
  static void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  // TDPBF16PS tmm[C], tmm[A], tmm[B]
  template <int C, int A, int B>
  static void dpbf16() {
    __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(C), "i"(A), "i"(B));
  }
};

}  // namespace
}  // namespace tiermoe::cpu::gemm
