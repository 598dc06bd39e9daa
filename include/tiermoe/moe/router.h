#pragma once
// MoE routers: which K of E experts each token goes to, and with what weight.
//
//   softmax_topk  (Qwen3-MoE, OLMoE, Mixtral): p = softmax(W x) over E, top-k of p,
//                 w = p[idx], renormalised to sum 1 iff norm_topk_prob.
//   deepseek_v3   s = sigmoid(W x); experts are chosen on s + e_score_correction_bias
//                 restricted to the topk_group best groups; w = s[idx] (unbiased),
//                 / (sum + 1e-20) iff norm_topk_prob, then * routed_scaling_factor.
//   deepseek_v2   p = softmax(W x) over E; experts are chosen on p restricted to the
//                 topk_group groups of best maximum p (all of them: greedy);
//                 w = p[idx] * routed_scaling_factor, never renormalised.
//   gpt_oss       l = W x + b; top-k of l; w = softmax over the K chosen logits.
//
// Numerics: the logits and everything after them are fp32 for f32 and bf16 runs
// (x and W upcast to fp32, fp32 accumulation; no bf16 rounding of the logits even
// where HF's bf16 nn.Linear would round them, see router.cpp) and f64 in f64 runs.
// Top-k ties break toward the lower expert id (lower group id for groups).
// The top-k selection is piecewise constant: gradients flow through the scores only.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

enum class RouterKind { softmax_topk, deepseek_v3, deepseek_v2, gpt_oss };
std::string_view router_kind_name(RouterKind kind);  // "softmax_topk", ...

struct RouterConfig {
  RouterKind kind = RouterKind::softmax_topk;
  int64_t hidden = 0;       // D
  int64_t num_experts = 0;  // E
  int64_t top_k = 0;        // K
  bool norm_topk_prob = false;           // softmax_topk (Qwen3-MoE/OLMoE); Mixtral sets it true; deepseek_v3
  int64_t n_group = 1, topk_group = 1;   // deepseek_v3, deepseek_v2
  double routed_scaling_factor = 1.0;    // deepseek_v3, deepseek_v2
  // Throws Error (naming `where`) on D, E or K < 1, K > E, groups not dividing E, topk_group > n_group,
  // K > (E / n_group) * topk_group, options that the kind does not use, ...
  void validate(std::string_view where = "router") const;
};

// What routing decided for T tokens. Score tensors are fp32 (f64 in f64 runs).
struct Routing {
  int64_t T = 0, K = 0;
  Tensor logits_TE;             // router logits (gpt_oss: W x + b)
  Tensor probs_TE;              // softmax over E; deepseek_v3: sigmoid
  std::vector<int32_t> ids_TK;  // selected experts, slot order k = 0..K-1 (descending selection score)
  Tensor weights_TK;            // combine weights
};

// fp32 for f32/bf16 compute, f64 for f64: the dtype of logits, scores, weights and their grads.
DType router_score_dtype(DType compute);

class Router {
 public:
  // Parameters are zero-initialised; tests and loaders fill them through param().
  // weight_ED is stored in `dtype` (the compute dtype); the biases and all grads are
  // stored in router_score_dtype(dtype). `name` appears in errors ("model.layers.3.mlp.gate").
  Router(RouterConfig cfg, DType dtype, std::string name = "router");

  const RouterConfig& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  const std::string& name() const { return name_; }

  // x_TD in the compute dtype.
  Routing forward(const Tensor& x_TD) const;

  // dweights_TK: d loss / d weights_TK (score dtype). dx_TD (compute dtype) is written,
  // or added to if accumulate. Parameter grads (weight, bias) always accumulate (+=).
  void backward(Tensor& dx_TD, const Tensor& dweights_TK, const Tensor& x_TD, const Routing& r,
                bool accumulate = false);
  // Same, plus an extra gradient straight on the logits (e.g. from aux_loss_backward),
  // dlogits_extra_TE in the score dtype. Either gradient may be an undefined Tensor.
  void backward(Tensor& dx_TD, const Tensor& dweights_TK, const Tensor& dlogits_extra_TE,
                const Tensor& x_TD, const Routing& r, bool accumulate = false);

  // d loss / d logits_TE from d loss / d weights_TK (the score-function part of
  // backward; exposed for tests and for callers that own the linear layer).
  Tensor scores_backward(const Tensor& dweights_TK, const Routing& r) const;

  // Parameters by name: "weight" [E, D]; "bias" [E] (gpt_oss);
  // "e_score_correction_bias" [E] (deepseek_v3, no grad: it only selects).
  std::vector<std::string> param_names() const;
  Tensor& param(std::string_view name);
  const Tensor& param(std::string_view name) const;
  bool has_grad(std::string_view name) const;  // false for e_score_correction_bias
  Tensor& grad(std::string_view name);         // same shape as the param, score dtype
  void zero_grad();

  // DeepSeek-V3 auxiliary-loss-free balancing: bias_e += gamma * sign(mean_load - load_e),
  // load_E = tokens (top-k slots) routed to each expert over the step.
  void update_selection_bias(const std::vector<int64_t>& load_E, double gamma);

 private:
  RouterConfig cfg_;
  DType dtype_;
  std::string name_;
  Tensor weight_ED;               // (E, D) compute dtype
  Tensor bias_E;                  // (E) score dtype, gpt_oss only
  Tensor selection_bias_E;        // (E) score dtype, deepseek_v3 only (e_score_correction_bias)
  Tensor dweight_ED;              // (E, D) score dtype
  Tensor dbias_E;                 // (E) score dtype
};

// Experts' load from a routing: top-k slots per expert, [E].
std::vector<int64_t> expert_counts(const Routing& r, int64_t num_experts);

}  // namespace tiermoe
