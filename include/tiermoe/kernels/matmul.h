#pragma once
// Matrix products of a linear layer, y = x W^T (nn.Linear's [out, in] weights),
// and its backward products. Every entry point exists twice with the same
// signature: ref:: (plain loops, the oracle) and cpu:: (the fast path:
// TierMoE's blocked GEMM on the process's ISA, kernels/cpu_isa.h).
//
// Dtypes: x, w and dy share one compute dtype T. Outputs are T, or f32 when T
// is bf16 (the f32 accumulator is then kept unrounded, e.g. for fp32 weight
// gradients). bf16 products accumulate in f32; f32 in f32; f64 in f64.
// With accumulate = true the product is added to the output (out += ...;
// ref sums the product first, then adds), otherwise it overwrites it.
// All tensors are 2-D and contiguous; outputs may not overlap inputs.
//
// Guarantees the parity tests rely on (tests/kernels/test_matmul.cpp):
// - cpu f64 equals ref f64 bit for bit (same summation order, no FMA).
// - cpu forward and backward_dx: row i of the result is bitwise the same
//   whatever the number of rows computed with it (M = 5 or 64, 100 or 128).
// - cpu backward_dw: appending zero rows to dy and x leaves dw bitwise
//   unchanged (an expert's rows padded to a bucket).
// They hold by construction on every TierMoE ISA (kernels/cpu/gemm/), not on
// the `onednn` baseline.
#include "tiermoe/core/tensor.h"

namespace tiermoe {

#define TIERMOE_MATMUL_DECLS                                                                     \
  /* y_MN (+)= x_MK . w_NK^T */                                                                  \
  void matmul_forward(Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK,                     \
                      bool accumulate = false);                                                  \
  /* dx_MK (+)= dy_MN . w_NK */                                                                  \
  void matmul_backward_dx(Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK,               \
                          bool accumulate = false);                                              \
  /* dw_NK (+)= dy_MN^T . x_MK */                                                                \
  void matmul_backward_dw(Tensor& dw_NK, const Tensor& dy_MN, const Tensor& x_MK,               \
                          bool accumulate = false);

namespace ref {
TIERMOE_MATMUL_DECLS
}
namespace cpu {
TIERMOE_MATMUL_DECLS
}

#undef TIERMOE_MATMUL_DECLS

}  // namespace tiermoe
