// Router: configuration checks, parameters, and the linear layer around the
// per-token score functions of router_scores.cpp.
//
// bf16 rounding: x and W are upcast to fp32 and the logits stay fp32. HF's
// DeepSeek-V3 router does exactly this; Qwen3-MoE, OLMoE, Mixtral and GPT-OSS
// run their gate as a bf16 nn.Linear, so their logits are rounded to bf16
// before the fp32 softmax (GPT-OSS even softmaxes the K values in bf16). We
// keep the fp32 logits for every family: bf16 logits carry 8 significant bits,
// which makes exact top-k ties between experts common and lets rounding choose
// experts; docs/architecture.md's numerics ask for fp32 routing; and HF parity is held in
// f64 runs, where the two agree. The products run on the cpu:: matmul kernels
// (bf16 operands upcast first), whose summation order differs from any other
// BLAS anyway, so bitwise equality with HF in bf16 is not a goal.
#include "tiermoe/moe/router.h"

#include <cmath>
#include <utility>

#include "router_scores.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe {

std::string_view router_kind_name(RouterKind kind) {
  switch (kind) {
    case RouterKind::softmax_topk: return "softmax_topk";
    case RouterKind::deepseek_v3: return "deepseek_v3";
    case RouterKind::deepseek_v2: return "deepseek_v2";
    case RouterKind::gpt_oss: return "gpt_oss";
  }
  return "?";
}

DType router_score_dtype(DType compute) {
  return compute == DType::f64 ? DType::f64 : DType::f32;
}

void RouterConfig::validate(std::string_view where) const {
  using detail::str_of;
  const std::string at(where);
  TIERMOE_CHECK(hidden >= 1, str_of("router hidden size D = ", hidden, " must be >= 1"), at,
                "set RouterConfig::hidden to the model's hidden_size");
  TIERMOE_CHECK(num_experts >= 1, str_of("router num_experts E = ", num_experts, " must be >= 1"),
                at, "set num_experts (HF: num_experts / num_local_experts / n_routed_experts)");
  TIERMOE_CHECK(top_k >= 1 && top_k <= num_experts,
                str_of("router top_k K = ", top_k, " must be in [1, E = ", num_experts, "]"), at,
                "check num_experts_per_tok against the number of experts");
  const bool grouped = kind == RouterKind::deepseek_v3 || kind == RouterKind::deepseek_v2;
  if (!grouped) {
    // Silently ignoring these would route differently from what the config says.
    TIERMOE_CHECK(n_group == 1 && topk_group == 1 && routed_scaling_factor == 1.0,
                  str_of("n_group = ", n_group, ", topk_group = ", topk_group,
                         ", routed_scaling_factor = ", routed_scaling_factor, " given to a ",
                         router_kind_name(kind), " router"),
                  at, "group-limited routing and score scaling exist only for DeepSeek's routers");
    return;
  }
  TIERMOE_CHECK(n_group >= 1 && num_experts % n_group == 0,
                str_of("n_group = ", n_group, " does not divide E = ", num_experts), at,
                "DeepSeek's groups are E / n_group consecutive experts; pick n_group dividing E");
  TIERMOE_CHECK(kind == RouterKind::deepseek_v2 || num_experts / n_group >= 2,
                str_of("groups of ", num_experts / n_group, " expert(s): E = ", num_experts,
                       ", n_group = ", n_group),
                at, "a group's score is the sum of its top-2 scores, so groups need >= 2 experts");
  TIERMOE_CHECK(topk_group >= 1 && topk_group <= n_group,
                str_of("topk_group = ", topk_group, " must be in [1, n_group = ", n_group, "]"), at,
                "topk_group is how many of the n_group groups each token may use");
  TIERMOE_CHECK(top_k <= num_experts / n_group * topk_group,
                str_of("top_k = ", top_k, " exceeds the ", num_experts / n_group * topk_group,
                       " experts in ", topk_group, " kept group(s) of ", num_experts / n_group),
                at, "raise topk_group or lower num_experts_per_tok");
  TIERMOE_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0,
                str_of("routed_scaling_factor = ", routed_scaling_factor, " must be > 0"), at,
                "DeepSeek-V3 uses 2.5; 1.0 disables the scaling");
  // transformers' DeepseekV2TopkRouter never renormalises (it drops the field).
  TIERMOE_CHECK(kind == RouterKind::deepseek_v3 || !norm_topk_prob,
                "norm_topk_prob given to a deepseek_v2 router", at,
                "DeepSeek-V2's weights are the chosen experts' softmax scores, scaled, as "
                "transformers computes them");
}

Router::Router(RouterConfig cfg, DType dtype, std::string name)
    : cfg_(cfg), dtype_(dtype), name_(std::move(name)) {
  cfg_.validate(name_);
  const int64_t E = cfg_.num_experts, D = cfg_.hidden;
  const DType sd = router_score_dtype(dtype_);
  weight_ED = Tensor::zeros({E, D}, dtype_, MemTag::weights);
  dweight_ED = Tensor::zeros({E, D}, sd, MemTag::grads);
  if (cfg_.kind == RouterKind::gpt_oss) {
    bias_E = Tensor::zeros({E}, sd, MemTag::weights);
    dbias_E = Tensor::zeros({E}, sd, MemTag::grads);
  }
  if (cfg_.kind == RouterKind::deepseek_v3) selection_bias_E = Tensor::zeros({E}, sd, MemTag::weights);
}

std::vector<std::string> Router::param_names() const {
  std::vector<std::string> names{"weight"};
  if (bias_E.defined()) names.emplace_back("bias");
  if (selection_bias_E.defined()) names.emplace_back("e_score_correction_bias");
  return names;
}

const Tensor& Router::param(std::string_view name) const {
  if (name == "weight") return weight_ED;
  if (name == "bias" && bias_E.defined()) return bias_E;
  if (name == "e_score_correction_bias" && selection_bias_E.defined()) return selection_bias_E;
  throw Error(detail::str_of("no router parameter '", name, "' in a ",
                             router_kind_name(cfg_.kind), " router"),
              name_, "parameters: weight; bias (gpt_oss); e_score_correction_bias (deepseek_v3)");
}

Tensor& Router::param(std::string_view name) {
  return const_cast<Tensor&>(std::as_const(*this).param(name));
}

bool Router::has_grad(std::string_view name) const {
  return name == "weight" || (name == "bias" && bias_E.defined());
}

Tensor& Router::grad(std::string_view name) {
  TIERMOE_CHECK(has_grad(name), detail::str_of("router parameter '", name, "' has no gradient"),
                name_, "e_score_correction_bias only selects experts; it is trained by "
                       "update_selection_bias, not by gradients");
  return name == "weight" ? dweight_ED : dbias_E;
}

void Router::zero_grad() {
  dweight_ED.zero();
  if (dbias_E.defined()) dbias_E.zero();
}

namespace {

// The operand as the linear layer computes with it: bf16 is upcast to fp32
// (exactly), f32 and f64 are used as they are.
Tensor upcast(const Tensor& t) { return t.dtype() == DType::bf16 ? t.to(DType::f32) : t; }

// logits_TE = x_TD . W_ED^T (+ b_E), in the score dtype.
void router_linear_forward(Tensor& logits_TE, const Tensor& x_TD, const Tensor& w_ED,
                           const Tensor& b_E) {
  cpu::matmul_forward(logits_TE, upcast(x_TD), upcast(w_ED));
  if (!b_E.defined()) return;
  visit_dtype(logits_TE.dtype(), [&]<class S>() {
    if constexpr (!std::is_same_v<S, bf16>) {
      const int64_t T = logits_TE.size(0), E = logits_TE.size(1);
      S* logits = logits_TE.data<S>();
      const S* b = b_E.data<S>();
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t e = 0; e < E; ++e) logits[t * E + e] += b[e];
      }
    }
  });
}

// dx_TD (+)= dlogits_TE . W_ED; dW_ED += dlogits_TE^T . x_TD; db_E += sum_t dlogits_TE.
void router_linear_backward(Tensor& dx_TD, Tensor& dw_ED, Tensor& db_E, const Tensor& dlogits_TE,
                            const Tensor& x_TD, const Tensor& w_ED, bool accumulate) {
  if (dx_TD.dtype() == DType::bf16) {
    // fp32 product, then one rounding to bf16 (after the add when accumulating).
    Tensor dx32 = accumulate ? dx_TD.to(DType::f32) : Tensor::empty(dx_TD.shape(), DType::f32);
    cpu::matmul_backward_dx(dx32, dlogits_TE, upcast(w_ED), accumulate);
    dx_TD.copy_from(dx32);
  } else {
    cpu::matmul_backward_dx(dx_TD, dlogits_TE, w_ED, accumulate);
  }
  cpu::matmul_backward_dw(dw_ED, dlogits_TE, upcast(x_TD), /*accumulate=*/true);
  if (!db_E.defined()) return;
  visit_dtype(dlogits_TE.dtype(), [&]<class S>() {
    if constexpr (!std::is_same_v<S, bf16>) {
      const int64_t T = dlogits_TE.size(0), E = dlogits_TE.size(1);
      const S* dl = dlogits_TE.data<S>();
      S* db = db_E.data<S>();
      for (int64_t e = 0; e < E; ++e) {
        S sum = 0;
        for (int64_t t = 0; t < T; ++t) sum += dl[t * E + e];
        db[e] += sum;
      }
    }
  });
}

}  // namespace

Routing Router::forward(const Tensor& x_TD) const {
  const int64_t E = cfg_.num_experts, K = cfg_.top_k, D = cfg_.hidden;
  TIERMOE_CHECK(x_TD.dim() == 2 && x_TD.size(1) == D,
                detail::str_of("router input x_TD is ", x_TD.str(), ", expected [T, ", D, "]"),
                name_, "the router takes the normalised hidden states, one row per token");
  check_dtype(x_TD, dtype_, name_ + " x_TD");
  const int64_t T = x_TD.size(0);
  const DType sd = router_score_dtype(dtype_);
  Routing r;
  r.T = T;
  r.K = K;
  r.logits_TE = Tensor::empty({T, E}, sd);
  r.probs_TE = Tensor::empty({T, E}, sd);
  r.weights_TK = Tensor::empty({T, K}, sd);
  r.ids_TK.resize(size_t(T * K));
  if (T == 0) return r;
  router_linear_forward(r.logits_TE, x_TD, weight_ED, bias_E);
  visit_dtype(sd, [&]<class S>() {
    if constexpr (!std::is_same_v<S, bf16>) {
      const S* logits = r.logits_TE.data<S>();
      for (int64_t i = 0; i < T * E; ++i) {
        TIERMOE_CHECK(std::isfinite(logits[i]),
                      detail::str_of("non-finite router logit ", double(logits[i]), " for token ",
                                     i / E, ", expert ", i % E),
                      name_, "the hidden states or the router weight hold NaN/Inf; check the "
                             "previous layer and the learning rate");
      }
      const S* bias = selection_bias_E.defined() ? selection_bias_E.data<S>() : nullptr;
      S* probs = r.probs_TE.data<S>();
      S* weights = r.weights_TK.data<S>();
      int32_t* ids = r.ids_TK.data();
      parallel_for(T, 64, [&](int64_t t0, int64_t t1) {
        router_detail::RouteScratch<S> scratch;
        for (int64_t t = t0; t < t1; ++t) {
          router_detail::route_token(ids + t * K, weights + t * K, probs + t * E, logits + t * E,
                                     bias, cfg_, scratch);
        }
      });
    }
  });
  return r;
}

Tensor Router::scores_backward(const Tensor& dweights_TK, const Routing& r) const {
  const int64_t E = cfg_.num_experts, K = cfg_.top_k, T = r.T;
  const DType sd = router_score_dtype(dtype_);
  TIERMOE_CHECK(r.K == K && r.logits_TE.defined() && r.logits_TE.size(1) == E,
                "routing does not come from this router", name_,
                "pass the Routing that this router's forward returned");
  check_shape(dweights_TK, {T, K}, name_ + " dweights_TK");
  check_dtype(dweights_TK, sd, name_ + " dweights_TK");
  Tensor dlogits_TE = Tensor::zeros({T, E}, sd);
  visit_dtype(sd, [&]<class S>() {
    if constexpr (!std::is_same_v<S, bf16>) {
      S* dl = dlogits_TE.data<S>();
      const S* dw = dweights_TK.data<S>();
      const S* probs = r.probs_TE.data<S>();
      const S* weights = r.weights_TK.data<S>();
      const int32_t* ids = r.ids_TK.data();
      parallel_for(T, 64, [&](int64_t t0, int64_t t1) {
        router_detail::RouteScratch<S> scratch;
        for (int64_t t = t0; t < t1; ++t) {
          router_detail::route_token_backward(dl + t * E, dw + t * K, probs + t * E, ids + t * K,
                                              weights + t * K, cfg_, scratch);
        }
      });
    }
  });
  return dlogits_TE;
}

void Router::backward(Tensor& dx_TD, const Tensor& dweights_TK, const Tensor& x_TD,
                      const Routing& r, bool accumulate) {
  backward(dx_TD, dweights_TK, Tensor(), x_TD, r, accumulate);
}

void Router::backward(Tensor& dx_TD, const Tensor& dweights_TK, const Tensor& dlogits_extra_TE,
                      const Tensor& x_TD, const Routing& r, bool accumulate) {
  const int64_t E = cfg_.num_experts, D = cfg_.hidden, T = r.T;
  const DType sd = router_score_dtype(dtype_);
  check_shape(x_TD, {T, D}, name_ + " x_TD");
  check_dtype(x_TD, dtype_, name_ + " x_TD");
  check_shape(dx_TD, {T, D}, name_ + " dx_TD");
  check_dtype(dx_TD, dtype_, name_ + " dx_TD");
  Tensor dlogits_TE = dweights_TK.defined() ? scores_backward(dweights_TK, r)
                                            : Tensor::zeros({T, E}, sd);
  if (dlogits_extra_TE.defined()) {
    check_shape(dlogits_extra_TE, {T, E}, name_ + " dlogits_extra_TE");
    check_dtype(dlogits_extra_TE, sd, name_ + " dlogits_extra_TE");
    visit_dtype(sd, [&]<class S>() {
      if constexpr (!std::is_same_v<S, bf16>) {
        S* dl = dlogits_TE.data<S>();
        const S* extra = dlogits_extra_TE.data<S>();
        for (int64_t i = 0; i < T * E; ++i) dl[i] += extra[i];
      }
    });
  }
  if (T == 0) return;
  router_linear_backward(dx_TD, dweight_ED, dbias_E, dlogits_TE, x_TD, weight_ED, accumulate);
}

void Router::update_selection_bias(const std::vector<int64_t>& load_E, double gamma) {
  const int64_t E = cfg_.num_experts;
  TIERMOE_CHECK(cfg_.kind == RouterKind::deepseek_v3,
                detail::str_of("update_selection_bias on a ", router_kind_name(cfg_.kind),
                               " router"),
                name_, "only deepseek_v3 routers have a selection bias");
  TIERMOE_CHECK(int64_t(load_E.size()) == E,
                detail::str_of("load_E has ", load_E.size(), " entries, expected E = ", E), name_,
                "pass one count per expert, e.g. expert_counts(routing, E)");
  double mean = 0;
  for (int64_t c : load_E) mean += double(c);
  mean /= double(E);
  // Overloaded experts lose bias, underloaded ones gain it; exact balance leaves it.
  for (int64_t e = 0; e < E; ++e) {
    const double gap = mean - double(load_E[e]);
    const double sign = gap > 0 ? 1.0 : gap < 0 ? -1.0 : 0.0;
    selection_bias_E.set(e, selection_bias_E.get(e) + gamma * sign);
  }
}

std::vector<int64_t> expert_counts(const Routing& r, int64_t num_experts) {
  std::vector<int64_t> count_E(static_cast<size_t>(num_experts), 0);
  for (int32_t id : r.ids_TK) {
    TIERMOE_ASSERT(id >= 0 && id < num_experts, "expert id ", id);
    ++count_E[size_t(id)];
  }
  return count_E;
}

}  // namespace tiermoe
