#pragma once
// Packing operands into a microkernel's layouts (microkernel.h), with zero
// padding past the matrix's rows, columns and K.
#include <cstdint>

#include "microkernel.h"

namespace tiermoe::cpu::gemm {

// A matrix as stored: element (i, j) at p[i * rs + j * cs] (in elements of
// dtype dt, f32 or bf16). Packing converts to the layout's width: bf16 into
// an f32 layout is widened (exact), f32 into a bf16 layout rounded to
// nearest even. So an f32 run reads bf16 weights through the f32 kernel
// without an upcast copy, and f32 scratch (attention's probabilities) feeds
// a bf16 kernel.
struct Mat {
  const void* p = nullptr;
  int64_t rs = 0, cs = 0;
  DType dt = DType::f64;  // never packed: a Mat that does not name its dtype is refused
};

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
inline int64_t ceil_div(int64_t v, int64_t m) { return (v + m - 1) / m; }

// Bytes of one packed micro-panel over kc.
inline int64_t a_panel_bytes(const Microkernel& uk, int64_t kc) {
  return uk.mr * kc * (uk.a == APack::f32_kmajor ? 4 : 2);
}
inline int64_t b_panel_bytes(const Microkernel& uk, int64_t kc) {
  return uk.nr * kc * (uk.b == BPack::f32 ? 4 : 2);
}

// One micro-panel of A: rows [i0, i0 + rows) with rows <= mr
// (the rest zero), k in [k0, k0 + kc) with entries at or past K zero.
void pack_a(const Microkernel& uk, const Mat& a, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
            int64_t K, void* dst);
// One panel of B: columns [j0, j0 + cols) with cols <= nr,
// k in [k0, k0 + kc), zero past K.
void pack_b(const Microkernel& uk, const Mat& b, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
            int64_t K, void* dst);

}  // namespace tiermoe::cpu::gemm
