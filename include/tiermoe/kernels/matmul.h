#pragma once
// Matrix products of a linear layer, y = x W^T (nn.Linear's [out, in] weights),
// and its backward products. Every entry point exists twice with the same
// signature: ref:: (plain loops, the oracle) and cpu:: (the fast path: oneDNN,
// AMX for bf16 where the CPU has it).
//
// Dtypes: x, w and dy share one compute dtype T. Outputs are T, or f32 when T
// is bf16 (the f32 accumulator is then kept unrounded, e.g. for fp32 weight
// gradients). bf16 products accumulate in f32; f32 in f32; f64 in f64.
// With accumulate = true the result is added to the output (out += ...),
// otherwise it overwrites it. All tensors are 2-D and contiguous.
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
