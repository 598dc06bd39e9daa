#pragma once
// Gated DeltaNet's short convolution: a causal depthwise conv1d over time
// with no bias, then SiLU, as transformers' causal_conv1d_forward computes
// it on [B, C, T] (here [B, T, C] rows of channels):
//
//   pre[b, t, c] = sum_{j < K} w_CK[c, j] x[b, t - K + 1 + j, c]
//   y[b, t, c]   = silu(pre[b, t, c])
//
// x before a row's first token reads 0 (the conv's left padding), and so
// does x before a packed document's first token (doc_start_BT as in
// kernels/attention.h): no token mixes in another document. Sums in f32
// (f64 for f64); pre is rounded to x's dtype before the SiLU, as a bf16
// conv1d then silu rounds. Backward treats that rounding as identity:
//   dpre = dy silu'(pre);  dx[t'] = sum_j w[c, j] dpre[t' + K - 1 - j];
//   dw[c, j] += sum_t dpre[t] x[t - K + 1 + j]
// dw_CK is f32 (f64 in f64 runs), as every weight gradient.
//
// ref:: and cpu:: twins: cpu:: runs ref::'s operations in ref::'s order for
// every element (bitwise ref::, whatever the thread count), a block of
// channels per task, each token's row of channels in one vectorized pass.
#include <cstdint>
#include <span>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

#define TIERMOE_CAUSAL_CONV_DECLS                                                              \
  void causal_conv_silu_forward(Tensor& y, const Tensor& x, const Tensor& w_CK,                \
                                std::span<const int32_t> doc_start_BT = {});                   \
  /* dx written; dw_CK += (may be undefined: a frozen weight). */                              \
  void causal_conv_silu_backward(Tensor& dx, Tensor& dw_CK, const Tensor& dy, const Tensor& x, \
                                 const Tensor& w_CK, std::span<const int32_t> doc_start_BT = {});

namespace ref {
TIERMOE_CAUSAL_CONV_DECLS
}
namespace cpu {
TIERMOE_CAUSAL_CONV_DECLS
}

#undef TIERMOE_CAUSAL_CONV_DECLS

}  // namespace tiermoe
