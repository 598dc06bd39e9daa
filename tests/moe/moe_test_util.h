#pragma once
// Shared builders for the MoE tests: random experts, hand-made routings
// (the fixed-router stub), and a scalar loss from a fixed random projection.
#include <algorithm>
#include <cstring>  // testing.h uses std::memcmp
#include <numeric>
#include <vector>

#include "common/testing.h"
#include "tiermoe/moe/experts.h"
#include "tiermoe/moe/router.h"

namespace tiermoe::testing {

inline void fill_experts(GroupedExperts& ex, Rng& rng, double scale = 0.5) {
  for (const auto& n : ex.param_names()) {
    Tensor& p = ex.param(n);
    if (n == "norm") fill_uniform(p, rng, 0.5, 1.5);
    else fill_normal(p, rng, 0.0, n[0] == 'b' ? 0.3 : scale);
  }
}

enum class Variant { swiglu, gpt_oss_bias, post_norm };

inline const char* variant_name(Variant v) {
  switch (v) {
    case Variant::swiglu: return "swiglu";
    case Variant::gpt_oss_bias: return "gpt_oss_bias";
    case Variant::post_norm: return "post_norm";
  }
  return "?";
}

inline ExpertsConfig experts_config(Variant v, int64_t E, int64_t D, int64_t F,
                                    KernelSet kernels = KernelSet::cpu) {
  ExpertsConfig c;
  c.num_experts = E, c.hidden = D, c.ffn = F, c.kernels = kernels;
  if (v == Variant::gpt_oss_bias) {
    c.activation = ExpertActivation::gpt_oss;
    c.bias = true;
    // Small limit so that some inputs are clamped and the clamp is exercised.
    c.gpt_oss.limit = 1.5;
  }
  if (v == Variant::post_norm) c.post_norm = true;
  return c;
}

// A fixed routing: K distinct experts per token drawn with a skew (low ids
// more often), positive weights. Scores in the score dtype of `dtype`.
inline Routing fixed_routing(int64_t T, int64_t K, int64_t E, DType dtype, Rng& rng) {
  Routing r;
  r.T = T, r.K = K;
  r.weights_TK = Tensor::empty({T, K}, dtype == DType::f64 ? DType::f64 : DType::f32);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool(static_cast<size_t>(E));
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t k = 0; k < K; ++k) {
      // Skewed pick: the minimum of two uniform draws favours the front.
      size_t span = pool.size() - size_t(k);
      size_t j = size_t(k) + std::min(rng.below(span), rng.below(span));
      std::swap(pool[size_t(k)], pool[j]);
      r.ids_TK.push_back(pool[size_t(k)]);
      r.weights_TK.set(t * K + k, rng.uniform(0.1, 1.0));
    }
  }
  return r;
}

inline Routing copy_routing(const Routing& r) {
  Routing c = r;
  if (r.weights_TK.defined()) c.weights_TK = r.weights_TK.clone();
  if (r.logits_TE.defined()) c.logits_TE = r.logits_TE.clone();
  if (r.probs_TE.defined()) c.probs_TE = r.probs_TE.clone();
  return c;
}

// loss = sum(out * P): the gradient of the output is P.
inline double projected_loss(const Tensor& out, const Tensor& P) {
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i) s += out.get(i) * P.get(i);
  return s;
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.get(i)));
  return m;
}

// rtol with an absolute floor relative to the tensor's scale (entries that
// cancel to ~0 carry the rounding of their larger terms).
inline ::testing::AssertionResult close_scaled(const Tensor& got, const Tensor& want, double rtol,
                                               const std::string& name) {
  return all_close(got, want, rtol, rtol * std::max(1e-300, max_abs(want)), name);
}

}  // namespace tiermoe::testing
