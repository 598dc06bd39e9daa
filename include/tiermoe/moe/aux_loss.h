#pragma once
// The Hugging Face load-balancing auxiliary loss (`load_balancing_loss_func`,
// Switch Transformer eqs. 4-6), as qwen3_moe, mixtral and olmoe compute it:
// over the router logits of all MoE layers stacked into [L*T, E],
//   p = softmax(logits) (full softmax over E, no top-k renormalisation),
//   c_e = how many top-k slots of p pick expert e (ties toward the lower id),
//   P_e = mean over rows of p_e,
//   aux = E * sum_e (c_e / (L*T)) * P_e.
// The counts are piecewise constant, so the gradient flows through P only.
// The loss is always this softmax top-k form, whatever router produced the
// logits (HF's other families ship their own variants; not implemented here).
// With a token mask (counted_T, one flag per token, the same for every layer)
// only counted tokens enter the means, as HF's load_balancing_loss_func does
// with an attention_mask (padding excluded); uncounted rows get no gradient.
#include <cstdint>
#include <span>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/moe/router.h"

namespace tiermoe {

struct AuxLoss {
  double value = 0;
  int64_t E = 0, K = 0;
  int64_t rows = 0;                 // L*T
  std::vector<int64_t> count_E;     // c_e: top-k slots per expert over all layers
  std::vector<double> mean_prob_E;  // P_e
  std::vector<uint8_t> counted_T;   // the token mask; empty: every token counts
};

// All layers must share E and K; logits_TE are read from each Routing.
// counted_T: empty, or one flag per token of each layer.
AuxLoss aux_loss_forward(std::span<const Routing* const> layers,
                         std::span<const uint8_t> counted_T = {});

// dlogits_TE[l] (=, or += if accumulate) daux * d aux / d layers[l]->logits_TE,
// in the logits' dtype. dlogits_TE[l] is allocated when undefined.
void aux_loss_backward(std::span<Tensor> dlogits_TE, double daux, const AuxLoss& aux,
                       std::span<const Routing* const> layers, bool accumulate = false);

}  // namespace tiermoe
