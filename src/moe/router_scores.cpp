#include "router_scores.h"

#include <algorithm>
#include <cmath>

namespace tiermoe::router_detail {

template <class S>
void top_k(int32_t* ids_K, const S* score_E, int64_t E, int64_t K) {
  // Insertion into a sorted list of at most K: O(E*K), and K is small. Scanning e
  // upward and inserting after every equal score is what makes ties go to the lower id.
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    S v = score_E[e];
    if (n == K && !(v > score_E[ids_K[K - 1]])) continue;
    int64_t pos = n < K ? n : K - 1;
    while (pos > 0 && v > score_E[ids_K[pos - 1]]) {
      ids_K[pos] = ids_K[pos - 1];
      --pos;
    }
    ids_K[pos] = int32_t(e);
    if (n < K) ++n;
  }
}

template <class S>
void softmax_row(S* y_N, const S* x_N, int64_t N) {
  S m = x_N[0];
  for (int64_t i = 1; i < N; ++i) m = std::max(m, x_N[i]);
  S sum = 0;
  for (int64_t i = 0; i < N; ++i) {
    y_N[i] = std::exp(x_N[i] - m);
    sum += y_N[i];
  }
  for (int64_t i = 0; i < N; ++i) y_N[i] = y_N[i] / sum;
}

namespace {

template <class S>
void route_softmax_topk(int32_t* ids_K, S* weights_K, S* probs_E, const S* logits_E,
                        const RouterConfig& cfg) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  softmax_row(probs_E, logits_E, E);
  top_k(ids_K, probs_E, E, K);
  S sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    weights_K[k] = probs_E[ids_K[k]];
    sum += weights_K[k];
  }
  if (cfg.norm_topk_prob) {
    for (int64_t k = 0; k < K; ++k) weights_K[k] = weights_K[k] / sum;
  }
}

template <class S>
void route_deepseek_v3(int32_t* ids_K, S* weights_K, S* probs_E, const S* logits_E,
                       const S* selection_bias_E, const RouterConfig& cfg,
                       RouteScratch<S>& scratch) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  const int64_t G = cfg.n_group, per_group = E / G;
  scratch.values.resize(size_t(E + G));
  scratch.ids.resize(size_t(cfg.topk_group));
  S* choice_E = scratch.values.data();
  S* group_score_G = choice_E + E;
  int32_t* kept = scratch.ids.data();
  for (int64_t e = 0; e < E; ++e) {
    probs_E[e] = S(1) / (S(1) + std::exp(-logits_E[e]));
    choice_E[e] = probs_E[e] + selection_bias_E[e];
  }
  // Group score = sum of the group's two best biased scores (validate() ensures two).
  for (int64_t g = 0; g < G; ++g) {
    const S* c = choice_E + g * per_group;
    S best = std::max(c[0], c[1]), second = std::min(c[0], c[1]);
    for (int64_t i = 2; i < per_group; ++i) {
      if (c[i] > best) second = best, best = c[i];
      else if (c[i] > second) second = c[i];
    }
    group_score_G[g] = best + second;
  }
  top_k(kept, group_score_G, G, cfg.topk_group);
  // Experts of dropped groups compete with a biased score of exactly 0.0, as HF's
  // masked_fill(0.0) does (not -inf: with negative biases they can still win).
  for (int64_t g = 0; g < G; ++g) {
    if (std::find(kept, kept + cfg.topk_group, int32_t(g)) != kept + cfg.topk_group) continue;
    std::fill(choice_E + g * per_group, choice_E + (g + 1) * per_group, S(0));
  }
  top_k(ids_K, choice_E, E, K);
  // The selection bias only chooses experts; weights come from the unbiased scores.
  S sum = 0;
  for (int64_t k = 0; k < K; ++k) {
    weights_K[k] = probs_E[ids_K[k]];
    sum += weights_K[k];
  }
  const S scale = S(cfg.routed_scaling_factor);
  const S denom = sum + S(1e-20);
  for (int64_t k = 0; k < K; ++k) {
    if (cfg.norm_topk_prob) weights_K[k] = weights_K[k] / denom;
    weights_K[k] = weights_K[k] * scale;
  }
}

// DeepSeek-V2's: group-limited like V3's, but on the softmax itself, a group
// scoring its best expert, and with no selection bias; the weights are the
// chosen probabilities, scaled.
template <class S>
void route_deepseek_v2(int32_t* ids_K, S* weights_K, S* probs_E, const S* logits_E,
                       const RouterConfig& cfg, RouteScratch<S>& scratch) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  const int64_t G = cfg.n_group, per_group = E / G;
  softmax_row(probs_E, logits_E, E);
  const S* choice_E = probs_E;
  if (cfg.topk_group < G) {
    scratch.values.resize(size_t(E + G));
    scratch.ids.resize(size_t(cfg.topk_group));
    S* masked_E = scratch.values.data();
    S* group_score_G = masked_E + E;
    int32_t* kept = scratch.ids.data();
    for (int64_t g = 0; g < G; ++g) {
      const S* p = probs_E + g * per_group;
      group_score_G[g] = *std::max_element(p, p + per_group);
    }
    top_k(kept, group_score_G, G, cfg.topk_group);
    // Dropped groups' experts score 0, as HF's masked_fill(0.0) leaves them.
    std::fill(masked_E, masked_E + E, S(0));
    for (int64_t i = 0; i < cfg.topk_group; ++i) {
      const int64_t g = kept[i];
      std::copy(probs_E + g * per_group, probs_E + (g + 1) * per_group, masked_E + g * per_group);
    }
    choice_E = masked_E;
  }
  top_k(ids_K, choice_E, E, K);
  const S scale = S(cfg.routed_scaling_factor);
  for (int64_t k = 0; k < K; ++k) weights_K[k] = probs_E[ids_K[k]] * scale;
}

template <class S>
void route_gpt_oss(int32_t* ids_K, S* weights_K, S* probs_E, const S* logits_E,
                   const RouterConfig& cfg, RouteScratch<S>& scratch) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  top_k(ids_K, logits_E, E, K);
  scratch.values.resize(size_t(K));
  for (int64_t k = 0; k < K; ++k) scratch.values[k] = logits_E[ids_K[k]];
  softmax_row(weights_K, scratch.values.data(), K);
  // Not used by the weights; kept for statistics and the aux loss.
  softmax_row(probs_E, logits_E, E);
}

}  // namespace

template <class S>
void route_token(int32_t* ids_K, S* weights_K, S* probs_E, const S* logits_E,
                 const S* selection_bias_E, const RouterConfig& cfg, RouteScratch<S>& scratch) {
  switch (cfg.kind) {
    case RouterKind::softmax_topk:
      return route_softmax_topk(ids_K, weights_K, probs_E, logits_E, cfg);
    case RouterKind::deepseek_v3:
      return route_deepseek_v3(ids_K, weights_K, probs_E, logits_E, selection_bias_E, cfg,
                               scratch);
    case RouterKind::deepseek_v2:
      return route_deepseek_v2(ids_K, weights_K, probs_E, logits_E, cfg, scratch);
    case RouterKind::gpt_oss:
      return route_gpt_oss(ids_K, weights_K, probs_E, logits_E, cfg, scratch);
  }
}

template <class S>
void route_token_backward(S* dlogits_E, const S* dweights_K, const S* probs_E,
                          const int32_t* ids_K, const S* weights_K, const RouterConfig& cfg,
                          RouteScratch<S>& scratch) {
  const int64_t E = cfg.num_experts, K = cfg.top_k;
  // sum_k dw_k * w_k: the shared term of every normalisation's backward.
  S dot = 0;
  for (int64_t k = 0; k < K; ++k) dot += dweights_K[k] * weights_K[k];
  switch (cfg.kind) {
    case RouterKind::softmax_topk:
    case RouterKind::deepseek_v2: {
      // w_k = scale * p_k, or p_k / sum_j p_j (softmax_topk's scale is 1): dp
      // is nonzero on the chosen experts only. The group limit only selects.
      const S scale = S(cfg.routed_scaling_factor);
      S sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += probs_E[ids_K[k]];
      scratch.values.assign(size_t(E), S(0));
      S* dp_E = scratch.values.data();
      for (int64_t k = 0; k < K; ++k) {
        dp_E[ids_K[k]] = cfg.norm_topk_prob ? (dweights_K[k] - dot) / sum : scale * dweights_K[k];
      }
      // Softmax over E: dl_e = p_e * (dp_e - sum_j dp_j p_j).
      S dp_dot_p = 0;
      for (int64_t k = 0; k < K; ++k) dp_dot_p += dp_E[ids_K[k]] * probs_E[ids_K[k]];
      for (int64_t e = 0; e < E; ++e) dlogits_E[e] += probs_E[e] * (dp_E[e] - dp_dot_p);
      return;
    }
    case RouterKind::deepseek_v3: {
      const S scale = S(cfg.routed_scaling_factor);
      S sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += probs_E[ids_K[k]];
      const S denom = sum + S(1e-20);
      // w_k = scale * s_k / denom, so ds_j = (scale * dw_j - sum_k dw_k w_k) / denom;
      // then through the sigmoid, ds/dl = s (1 - s).
      for (int64_t k = 0; k < K; ++k) {
        const S s = probs_E[ids_K[k]];
        const S ds = cfg.norm_topk_prob ? (scale * dweights_K[k] - dot) / denom
                                        : scale * dweights_K[k];
        dlogits_E[ids_K[k]] += ds * (s * (S(1) - s));
      }
      return;
    }
    case RouterKind::gpt_oss:
      // Softmax over the K chosen logits: dl_k = w_k (dw_k - sum_j dw_j w_j).
      for (int64_t k = 0; k < K; ++k) dlogits_E[ids_K[k]] += weights_K[k] * (dweights_K[k] - dot);
      return;
  }
}

#define TIERMOE_INSTANTIATE(S)                                                                  \
  template void softmax_row<S>(S*, const S*, int64_t);                                          \
  template void top_k<S>(int32_t*, const S*, int64_t, int64_t);                                 \
  template void route_token<S>(int32_t*, S*, S*, const S*, const S*, const RouterConfig&,       \
                               RouteScratch<S>&);                                               \
  template void route_token_backward<S>(S*, const S*, const S*, const int32_t*, const S*,       \
                                        const RouterConfig&, RouteScratch<S>&);
TIERMOE_INSTANTIATE(float)
TIERMOE_INSTANTIATE(double)
#undef TIERMOE_INSTANTIATE

}  // namespace tiermoe::router_detail
