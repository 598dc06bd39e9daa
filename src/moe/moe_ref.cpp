#include "tiermoe/moe/moe_ref.h"

#include <algorithm>
#include <cmath>

namespace tiermoe {

namespace {

// One expert on one token row: y_D = expert_e(x_D), rounded to T.
template <class T>
void expert_ref(std::vector<acc_t<T>>& y, const T* x, const GroupedExperts& ex, int64_t e) {
  using A = acc_t<T>;
  const ExpertsConfig& c = ex.config();
  const int64_t D = c.hidden, F = c.ffn;
  const T* w13 = ex.param("w13").data<T>() + e * 2 * F * D;
  const T* w2 = ex.param("w2").data<T>() + e * D * F;
  std::vector<A> h(static_cast<size_t>(2 * F)), a(static_cast<size_t>(F));
  for (int64_t j = 0; j < 2 * F; ++j) {
    A s = 0;
    for (int64_t d = 0; d < D; ++d) s += load<T>(x[d]) * load<T>(w13[j * D + d]);
    s = round_to<T>(s);
    if (c.bias) s = round_to<T>(s + load<T>(ex.param("b13").data<T>()[e * 2 * F + j]));
    h[size_t(j)] = s;
  }
  for (int64_t f = 0; f < F; ++f) {
    if (c.activation == ExpertActivation::gpt_oss) {
      const A alpha = A(c.gpt_oss.alpha), limit = A(c.gpt_oss.limit);
      A gate = std::min(h[size_t(2 * f)], limit);
      A up = std::clamp(h[size_t(2 * f + 1)], -limit, limit);
      a[size_t(f)] = round_to<T>((up + A(1)) * (gate / (A(1) + std::exp(-alpha * gate))));
    } else {
      A gate = h[size_t(f)], up = h[size_t(F + f)];
      a[size_t(f)] = round_to<T>(gate / (A(1) + std::exp(-gate)) * up);
    }
  }
  for (int64_t d = 0; d < D; ++d) {
    A s = 0;
    for (int64_t f = 0; f < F; ++f) s += a[size_t(f)] * load<T>(w2[d * F + f]);
    s = round_to<T>(s);
    if (c.bias) s = round_to<T>(s + load<T>(ex.param("b2").data<T>()[e * D + d]));
    y[size_t(d)] = s;
  }
  if (c.post_norm) {
    A ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += y[size_t(d)] * y[size_t(d)];
    A r = A(1) / std::sqrt(ss / A(D) + A(c.norm_eps));
    const T* w = ex.param("norm").data<T>() + e * D;
    for (int64_t d = 0; d < D; ++d) y[size_t(d)] = round_to<T>(load<T>(w[d]) * (y[size_t(d)] * r));
  }
}

}  // namespace

void moe_ref_forward(Tensor& out_TD, const Tensor& x_TD, const std::vector<int32_t>& ids_TK,
                     const Tensor& weights_TK, const GroupedExperts& experts) {
  const int64_t T = x_TD.size(0), D = experts.config().hidden, K = weights_TK.size(1);
  check_shape(x_TD, {T, D}, "moe_ref_forward: x_TD");
  check_shape(out_TD, {T, D}, "moe_ref_forward: out_TD");
  check_shape(weights_TK, {T, K}, "moe_ref_forward: weights_TK");
  TIERMOE_CHECK(int64_t(ids_TK.size()) == T * K, "ids_TK does not match weights_TK",
                "moe_ref_forward", "pass one routing's ids and weights");
  visit_dtype(x_TD.dtype(), [&]<class T_>() {
    using A = acc_t<T_>;
    const T_* x = x_TD.data<T_>();
    T_* out = out_TD.data<T_>();
    std::vector<A> y(static_cast<size_t>(D)), sum(static_cast<size_t>(D));
    for (int64_t t = 0; t < T; ++t) {
      std::fill(sum.begin(), sum.end(), A(0));
      for (int64_t k = 0; k < K; ++k) {
        expert_ref<T_>(y, x + t * D, experts, ids_TK[size_t(t * K + k)]);
        A w = A(weights_TK.get(t * K + k));
        for (int64_t d = 0; d < D; ++d) sum[size_t(d)] += w * y[size_t(d)];
      }
      for (int64_t d = 0; d < D; ++d) out[t * D + d] = store<T_>(sum[size_t(d)]);
    }
  });
}

}  // namespace tiermoe
