#pragma once
// RMSNorm as Hugging Face's Qwen3MoeRMSNorm computes it, over the last
// dimension D of x (any rank: [T, D] hidden states, or [T, H, P] heads for the
// per-head q/k norm with a [P] weight); ref:: and cpu:: twins.
//
//   rstd = 1 / sqrt(mean(x^2) + eps)        in f32 (f64 in f64 runs)
//   y    = w * cast(x * rstd)               cast to x's dtype, THEN times w
//   y    = cast(w * (x * rstd))             RmsNormCast::after_weight: gpt-oss's
//                                           GptOssRMSNorm, one rounding
//   y    = cast((1 + w) * (x * rstd))       RmsNormCast::unit_offset: Qwen3-Next's and
//                                           Qwen3.5's zero-centred weight, 1 + w in
//                                           f32, one rounding
// (the two orders differ only in bf16: f32 and f64 runs round nothing between).
//
// x, y, w and dy share one dtype T. rstd_R ([R], R = numel / D) is kept for
// backward in f32 (f64 for f64). The weight gradient dw_D is f32 for bf16/f32
// runs and f64 for f64: it sums over rows and feeds fp32 master weights.
// Backward treats the cast as identity (a straight-through rounding):
//   dx = rstd * (g - n * mean(g * n)),  g = w * dy,  n = x * rstd (unrounded)
//   dw += sum over rows of dy * cast(x * rstd)     (after_weight: dy * x * rstd)
// with 1 + w for w under unit_offset (and dw as after_weight's).
#include "tiermoe/core/tensor.h"

namespace tiermoe {

// Where y rounds to x's dtype: after normalising (Llama, Qwen: the default),
// or after the weight (gpt-oss), or after a weight of 1 + w (Qwen3-Next).
enum class RmsNormCast : uint8_t { after_normalize, after_weight, unit_offset };

#define TIERMOE_RMSNORM_DECLS                                                                     \
  /* rstd_R may be undefined when no backward follows */                                          \
  void rmsnorm_forward(Tensor& y, Tensor& rstd_R, const Tensor& x, const Tensor& w_D, double eps, \
                       RmsNormCast cast = RmsNormCast::after_normalize);                          \
  /* dx (+)= and dw_D (+)= with accumulate; dw_D may be undefined (a frozen weight) */            \
  void rmsnorm_backward(Tensor& dx, Tensor& dw_D, const Tensor& dy, const Tensor& x,              \
                        const Tensor& w_D, const Tensor& rstd_R, bool accumulate = false,         \
                        RmsNormCast cast = RmsNormCast::after_normalize);

namespace ref {
TIERMOE_RMSNORM_DECLS
}
namespace cpu {
TIERMOE_RMSNORM_DECLS
}

#undef TIERMOE_RMSNORM_DECLS

}  // namespace tiermoe
