#pragma once
// Per-token score functions of the routers (internal to src/moe): from one
// token's logits to its experts and weights, and back from d weights to
// d logits. S is the score type: float, or double in f64 runs.
#include <cstdint>
#include <vector>

#include "tiermoe/moe/router.h"

namespace tiermoe::router_detail {

// y_N = softmax(x_N), max-subtracted, summed in index order.
template <class S>
void softmax_row(S* y_N, const S* x_N, int64_t N);

// ids_K = the K largest of score_E in descending order; equal scores keep
// ascending expert ids, so ties break toward the lower id.
template <class S>
void top_k(int32_t* ids_K, const S* score_E, int64_t E, int64_t K);

// Working memory reused from token to token by one thread.
template <class S>
struct RouteScratch {
  std::vector<S> values;
  std::vector<int32_t> ids;
};

// One token: probs_E (softmax or sigmoid), ids_K and weights_K from logits_E.
// selection_bias_E is read by deepseek_v3 only.
template <class S>
void route_token(int32_t* ids_K, S* weights_K, S* probs_E, const S* logits_E,
                 const S* selection_bias_E, const RouterConfig& cfg, RouteScratch<S>& scratch);

// One token: dlogits_E += d loss / d logits_E given d loss / d weights_K.
template <class S>
void route_token_backward(S* dlogits_E, const S* dweights_K, const S* probs_E,
                          const int32_t* ids_K, const S* weights_K, const RouterConfig& cfg,
                          RouteScratch<S>& scratch);

}  // namespace tiermoe::router_detail
