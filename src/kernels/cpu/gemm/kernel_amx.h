#pragma once
// The AMX microkernel (amx, and amx-emu): a 32 x 32 block of C in four f32
// tiles, A in two 16-row tiles, B in two 16-column tiles, one TDPBF16PS per
// C tile per 32 values of k:
//
//   tmm0 = C rows 0-15, cols 0-15     tmm4 = A rows 0-15     tmm6 = B cols 0-15
//   tmm1 = C rows 0-15, cols 16-31    tmm5 = A rows 16-31    tmm7 = B cols 16-31
//   tmm2 = C rows 16-31, cols 0-15
//   tmm3 = C rows 16-31, cols 16-31
//
// Every tile is configured once per thread at its full 16 rows x 64 bytes
// (amx_begin), so every row of C, padding or not, goes through the same
// instructions; each element's sum is its own per the SDM (the even and odd
// products of one 32-k step summed apart from zero, then added to C), so a
// row's bits depend only on its row of A and the columns of B.
//
// Templates over a tile wrapper T (ops_amx.h, ops_amx_emu.h).
#include <cstdint>

#include "amx_config.h"

namespace tiermoe::cpu::gemm {

template <class T>
void amx_begin() {
  TileConfig cfg;
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  T::load_config(&cfg);
}

template <class T>
void amx_end() {
  T::release();
}

// C[32 x 32] (+)= A . B with A packed bf16_tiles [kc/32][32][32], B packed
// bf16_pairs [kc/2][32][2]; kc a multiple of 32. Both are read in the order
// they are stored, 4 KB per step of 32 k.
template <class T>
void amx_kernel(int64_t kc, const void* a_, const void* b_, float* c_, int64_t ldc, bool load_c) {
  const char* a = static_cast<const char*>(a_);
  const char* b = static_cast<const char*>(b_);
  char* c = reinterpret_cast<char*>(c_);
  const int64_t a_stride = 32 * 2;   // bytes per row of an A tile (32 k)
  const int64_t b_stride = 32 * 4;   // bytes per pair row of B (32 columns x 2 bf16)
  const int64_t c_stride = ldc * 4;  // bytes per row of C
  if (load_c) {
    T::template load<0>(c, c_stride);
    T::template load<1>(c + 64, c_stride);
    T::template load<2>(c + 16 * c_stride, c_stride);
    T::template load<3>(c + 16 * c_stride + 64, c_stride);
  } else {
    T::template zero<0>();
    T::template zero<1>();
    T::template zero<2>();
    T::template zero<3>();
  }
  for (int64_t k = 0; k < kc; k += 32) {
    const char* a_k = a + k * 64;  // 32 rows x 32 k x 2 bytes per step
    const char* b_k = b + (k / 2) * b_stride;
    T::template load<4>(a_k, a_stride);
    T::template load<5>(a_k + 16 * a_stride, a_stride);
    T::template load<6>(b_k, b_stride);
    T::template load<7>(b_k + 64, b_stride);
    T::template dpbf16<0, 4, 6>();
    T::template dpbf16<1, 4, 7>();
    T::template dpbf16<2, 5, 6>();
    T::template dpbf16<3, 5, 7>();
  }
  T::template store<0>(c, c_stride);
  T::template store<1>(c + 64, c_stride);
  T::template store<2>(c + 16 * c_stride, c_stride);
  T::template store<3>(c + 16 * c_stride + 64, c_stride);
}

}  // namespace tiermoe::cpu::gemm
