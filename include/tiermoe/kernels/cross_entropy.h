#pragma once
// Cross-entropy over the vocabulary, as Hugging Face's causal-LM loss computes
// it: logits upcast to f32 (f64 in f64 runs), targets equal to kIgnoreIndex
// skipped, mean over the remaining targets. ref:: and cpu:: twins.
//
//   loss_t = logsumexp(logits_NV[t]) - logits_NV[t, target_t]   in f32 (f64)
//   loss   = sum over counted t of loss_t / count               summed in f64
//
// No counted target (all ignored, or N = 0) gives loss 0 and a zero gradient,
// never NaN. A target outside [0, V) other than kIgnoreIndex is an Error
// naming its position. The fused version also writes
//   dlogits_NV[t] = dloss / count * (softmax(logits_NV[t]) - onehot(target_t))
// (zero rows for ignored targets) in the logits' dtype, overwriting it; the
// logits are read once per row, so a [N, V] f32 copy is never made.
#include <cstdint>
#include <span>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

inline constexpr int32_t kIgnoreIndex = -100;

#define TIERMOE_CROSS_ENTROPY_DECLS                                                            \
  /* the loss only (evaluation) */                                                             \
  double cross_entropy_forward(const Tensor& logits_NV, std::span<const int32_t> targets_N);  \
  /* the loss, and its gradient times dloss into dlogits_NV */                                 \
  double cross_entropy_forward_backward(Tensor& dlogits_NV, const Tensor& logits_NV,          \
                                        std::span<const int32_t> targets_N, double dloss = 1.0);

namespace ref {
TIERMOE_CROSS_ENTROPY_DECLS
}
namespace cpu {
TIERMOE_CROSS_ENTROPY_DECLS
}

#undef TIERMOE_CROSS_ENTROPY_DECLS

}  // namespace tiermoe
