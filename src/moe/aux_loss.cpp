#include "tiermoe/moe/aux_loss.h"

#include <algorithm>
#include <cmath>

#include "router_scores.h"

namespace tiermoe {

namespace {

// The layers' logits as HF concatenates them: same E and K, same score dtype.
void check_layers(std::span<const Routing* const> layers, int64_t E, int64_t K, DType sd) {
  for (size_t l = 0; l < layers.size(); ++l) {
    const Routing* r = layers[l];
    const std::string where = detail::str_of("aux loss, MoE layer ", l);
    TIERMOE_CHECK(r && r->logits_TE.defined() && r->logits_TE.dim() == 2,
                  "missing router logits", where, "pass the Routing of every MoE layer");
    TIERMOE_CHECK(r->logits_TE.size(1) == E && r->K == K && r->logits_TE.dtype() == sd,
                  detail::str_of("logits ", r->logits_TE.str(), " with K = ", r->K,
                                 " do not match layer 0 (E = ", E, ", K = ", K, ", ",
                                 dtype_name(sd), ")"),
                  where, "the aux loss concatenates all layers' logits; they must share E and K");
  }
}

}  // namespace

AuxLoss aux_loss_forward(std::span<const Routing* const> layers,
                         std::span<const uint8_t> counted_T) {
  TIERMOE_CHECK(!layers.empty() && layers[0], "no MoE layers given", "aux loss",
                "pass the Routing of every MoE layer of the forward");
  AuxLoss aux;
  aux.E = layers[0]->logits_TE.size(1);
  aux.K = layers[0]->K;
  const DType sd = layers[0]->logits_TE.dtype();
  check_layers(layers, aux.E, aux.K, sd);
  aux.counted_T.assign(counted_T.begin(), counted_T.end());
  for (const Routing* r : layers) {
    TIERMOE_CHECK(counted_T.empty() || int64_t(counted_T.size()) == r->logits_TE.size(0),
                  detail::str_of(counted_T.size(), " token flags for ", r->logits_TE.size(0),
                                 " tokens"),
                  "aux loss", "pass one flag per token, or none");
  }
  const int64_t E = aux.E, K = aux.K;
  aux.count_E.assign(size_t(E), 0);
  aux.mean_prob_E.assign(size_t(E), 0.0);
  // Sums in the score dtype, row by row in layer order, as one [L*T, E] tensor would.
  visit_dtype(sd, [&]<class S>() {
    if constexpr (!std::is_same_v<S, bf16>) {
      std::vector<S> p_E(static_cast<size_t>(E)), prob_sum_E(static_cast<size_t>(E), S(0));
      std::vector<int32_t> ids_K(static_cast<size_t>(K));
      for (const Routing* r : layers) {
        const S* logits = r->logits_TE.data<S>();
        for (int64_t t = 0; t < r->logits_TE.size(0); ++t) {
          if (!counted_T.empty() && !counted_T[size_t(t)]) continue;
          router_detail::softmax_row(p_E.data(), logits + t * E, E);
          router_detail::top_k(ids_K.data(), p_E.data(), E, K);
          for (int32_t id : ids_K) ++aux.count_E[size_t(id)];
          for (int64_t e = 0; e < E; ++e) prob_sum_E[e] += p_E[e];
          ++aux.rows;
        }
      }
      TIERMOE_CHECK(aux.rows > 0, "no tokens", "aux loss", "the MoE layers routed no tokens");
      const double n = double(aux.rows);
      for (int64_t e = 0; e < E; ++e) {
        aux.mean_prob_E[e] = double(prob_sum_E[e]) / n;
        aux.value += double(aux.count_E[e]) / n * aux.mean_prob_E[e];
      }
      aux.value *= double(E);
    }
  });
  return aux;
}

void aux_loss_backward(std::span<Tensor> dlogits_TE, double daux, const AuxLoss& aux,
                       std::span<const Routing* const> layers, bool accumulate) {
  TIERMOE_CHECK(dlogits_TE.size() == layers.size() && !layers.empty(),
                detail::str_of(dlogits_TE.size(), " gradient tensors for ", layers.size(),
                               " MoE layers"),
                "aux loss backward", "pass one dlogits_TE per layer");
  const int64_t E = aux.E, K = aux.K;
  const DType sd = layers[0]->logits_TE.dtype();
  check_layers(layers, E, K, sd);
  const double n = double(aux.rows);
  // aux = E/n^2 * sum_e c_e * sum_rows p_e, so d aux / d p_te = E c_e / n^2 for every row.
  visit_dtype(sd, [&]<class S>() {
    if constexpr (!std::is_same_v<S, bf16>) {
      std::vector<S> g_E(static_cast<size_t>(E)), p_E(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        g_E[e] = S(daux * double(E) * double(aux.count_E[e]) / (n * n));
      }
      for (size_t l = 0; l < layers.size(); ++l) {
        const Routing* r = layers[l];
        const int64_t T = r->logits_TE.size(0);
        Tensor& out = dlogits_TE[l];
        if (!out.defined()) {
          out = Tensor::zeros({T, E}, sd);
        } else {
          check_shape(out, {T, E}, detail::str_of("aux loss dlogits_TE[", l, "]"));
          check_dtype(out, sd, detail::str_of("aux loss dlogits_TE[", l, "]"));
        }
        const S* logits = r->logits_TE.data<S>();
        S* dl = out.data<S>();
        for (int64_t t = 0; t < T; ++t) {
          if (!aux.counted_T.empty() && !aux.counted_T[size_t(t)]) {
            if (!accumulate) std::fill_n(dl + t * E, E, S(0));
            continue;
          }
          router_detail::softmax_row(p_E.data(), logits + t * E, E);
          S g_dot_p = 0;
          for (int64_t e = 0; e < E; ++e) g_dot_p += g_E[e] * p_E[e];
          for (int64_t e = 0; e < E; ++e) {
            const S v = p_E[e] * (g_E[e] - g_dot_p);
            dl[t * E + e] = accumulate ? dl[t * E + e] + v : v;
          }
        }
      }
    }
  });
}

}  // namespace tiermoe
