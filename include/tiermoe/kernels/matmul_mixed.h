#pragma once
// The linear-layer products of kernels/matmul.h with a weight stored narrower
// than the activations: a frozen bf16 checkpoint weight used as it is stored
// (e.g. memory-mapped) by an f32 or f64 run, or an f32 weight by an f64 run.
//
//   y_MN (+)= x_MK . w_NK^T        dx_MK (+)= dy_MN . w_NK
//
// The result is, by definition, that of matmul_forward / matmul_backward_dx
// on the weight converted to the activations' dtype (bf16 -> f32 and
// f32 -> f64 are exact), so a run on stored-width weights computes what a run
// on upcast copies computed; only no upcast copy is ever held. When w already
// has the activations' dtype these are matmul_forward / matmul_backward_dx.
//
// ref:: converts the whole weight, then calls ref::matmul (the oracle).
// cpu:: in an f32 run on TierMoE's GEMM (kernels/cpu_isa.h) reads a bf16
// weight as stored: the GEMM widens it while packing the panels its
// microkernel reads, so the product runs at the speed of the plain f32
// product, needs no scratch beyond the GEMM's own, and is bitwise
// cpu::matmul on the widened weight (the same kernel on the same packed
// values). Elsewhere (f64 runs, and the onednn baseline) it converts the
// weight in blocks into a small scratch and runs the cpu:: product on each
// block: forward in blocks of w's rows (output columns), dx in blocks of
// w's columns (again output columns), so every output element is one whole
// product over the full reduction, never a sum of partial ones; bitwise
// cpu::matmul on the converted weight for gemm_f64 by construction, and for
// oneDNN 2.6's f32 forward on AVX2 (its f32 dx reorders the reduction with
// the output width and differs by ulps; tests/kernels/test_matmul_mixed.cpp).
// That path's conversion reads every weight element once per call, plus a
// write into cache-sized scratch of at most kMixedScratchBytes.
#include <cstddef>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

inline constexpr size_t kMixedScratchBytes = size_t(4) << 20;

#define TIERMOE_MATMUL_MIXED_DECLS                                                      \
  /* y_MN (+)= x_MK . w_NK^T, w stored in a dtype no wider than x's */                  \
  void matmul_forward_mixed(Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK,       \
                            bool accumulate = false);                                   \
  /* dx_MK (+)= dy_MN . w_NK, w stored in a dtype no wider than dy's */                 \
  void matmul_backward_dx_mixed(Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK, \
                                bool accumulate = false);

namespace ref {
TIERMOE_MATMUL_MIXED_DECLS
}
namespace cpu {
TIERMOE_MATMUL_MIXED_DECLS
}

#undef TIERMOE_MATMUL_MIXED_DECLS

namespace cpu {
// The scratch one cpu:: *_mixed product allocates (memory plans count it):
// none where the GEMM reads the weight as stored; else the weight widened to `compute` in blocks of
// whole columns of `depth` values, at most kMixedScratchBytes, and unless one block holds all
// `width` columns, a block's output for `rows` rows. For w_NK: forward depth K, width N; dx depth
// N, width K.
size_t mixed_scratch_bytes(int64_t rows, int64_t depth, int64_t width, DType compute);
}  // namespace cpu

// Whether a weight stored in `stored` can serve products in `compute`
// through the *_mixed entry points (equal, or narrower: bf16 < f32 < f64).
bool is_narrower_or_same(DType stored, DType compute);

}  // namespace tiermoe
