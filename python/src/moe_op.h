#pragma once
// The engine side of one transformers MoE module, for the Python package.
//
// Two uses, one class:
//   - the "tiermoe" experts backend (tiermoe.transformers): transformers'
//     router runs in PyTorch and hands over ids_TK and weights_TK; the op
//     dispatches, runs the experts and combines (no Router);
//   - the whole block (tiermoe.torch.patch): the op routes too, with the
//     engine's Router over the module's router weights.
// Either way the experts are a GroupedExperts whose weights are views of
// torch's tensors (bound, never copied), run by HostExperts through a
// MoeLayer with a LocalDispatcher, so the math, the grouped kernels and the
// packed-weight cache are those of the CLI.
#include <cstdint>
#include <string>
#include <vector>

#include "tiermoe/model/expert_lora_adapter.h"
#include "tiermoe/model/lora.h"
#include "tiermoe/moe/dispatch.h"
#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/expert_kernels.h"
#include "tiermoe/moe/experts.h"
#include "tiermoe/moe/moe_layer.h"
#include "tiermoe/moe/router.h"
#include "tiermoe/tier/device_tier.h"

namespace tiermoe::py {

struct MoeOpConfig {
  ExpertsConfig experts;  // E, D, F, activation (swiglu | gpt_oss), bias
  DType dtype = DType::f32;
  AbsorbScores absorb = AbsorbScores::automatic;
  MoeRegionKeep keep;  // remat: what the forward keeps (the rest is replayed in backward)
  bool routes = false;  // true: the op owns a Router configured by `router`
  RouterConfig router;
  std::string name = "moe";  // the module path, in errors
};

class MoeOp {
 public:
  explicit MoeOp(MoeOpConfig cfg);
  MoeOp(const MoeOp&) = delete;
  MoeOp& operator=(const MoeOp&) = delete;

  const MoeOpConfig& config() const { return cfg_; }
  bool absorbs_scores() const { return layer_.absorbs_scores(); }

  // The experts' weights in the engine's layout (w13 [E, 2F, D], w2 [E, D, F],
  // with bias b13 [E, 2F], b2 [E, D]), as views. Every call counts as a
  // weight change (the packed copies are rebuilt on next use): the Python
  // side calls it only when a tensor's version or address moved.
  void bind_experts(Tensor w13_EFD, Tensor w2_EDF, Tensor b13_E2F, Tensor b2_ED);
  // The router's weight [E, D] (compute dtype, a view), its bias [E]
  // (gpt_oss) and e_score_correction_bias [E] (deepseek_v3), both in the
  // score dtype. Only for an op that routes.
  void bind_router(Tensor weight_ED, Tensor bias_E, Tensor selection_bias_E);

  // LoRA of rank R on the experts' gate_proj and up_proj (w13) and/or
  // down_proj (w2), at scaling 1 (the caller folds its scaling into B),
  // computed beside the frozen weights as thin products (model/lora.h). Its
  // weights are bound by bind_lora before each forward; rank 0 removes it. A
  // call with the LoRA's own rank and projections changes nothing.
  void set_lora(int64_t rank, bool w13, bool w2);
  int64_t lora_rank() const { return lora_ ? lora_->rank() : 0; }
  // "gate", "up" or "down": A [E, R, in] and B [E, out, R] in the LoRA master
  // dtype (f32 for bf16 runs), as views.
  void bind_lora(const std::string& proj, Tensor A_ERI, Tensor B_EOR);

  // out_TD for routing given by the caller (ids_TK: T*K ids, weights_TK
  // [T, K] in the score dtype). expert_grads: a backward wants the experts'
  // weight gradients; adapter_grads: the LoRA's.
  Tensor forward_routed(MoeSaved& saved, const Tensor& x_TD, std::vector<int32_t> ids_TK,
                        Tensor weights_TK, bool expert_grads, bool adapter_grads);
  // out_TD routed by the op's Router; logits_TE gets the router logits.
  Tensor forward(MoeSaved& saved, Tensor& logits_TE, const Tensor& x_TD, bool expert_grads,
                 bool adapter_grads);

  // dx_TD (written) and, returned, d loss / d weights_TK. The router's and
  // (when the forward asked) the experts' gradients are this call's alone:
  // they start from zero and are read with grad() before the next backward.
  // dlogits_TE (an op that routes: the gradient reaching the logits it
  // returned, e.g. from the aux loss) may be undefined.
  Tensor backward(Tensor& dx_TD, const Tensor& dout_TD, MoeSaved& saved,
                  const Tensor& dlogits_TE);

  // "w13", "w2", "b13", "b2" (experts), "router.weight", "router.bias" or
  // "lora.gate.A", "lora.up.B", ... : the last backward's gradient, in the
  // grad dtype (f32 for bf16 runs; the LoRA's in its master dtype).
  const Tensor& grad(const std::string& name);

  ExpertPackStats pack_stats() const { return experts_.packs().stats(); }

  // Runs the experts on the device tier's executor for layer `layer` from
  // the next forward on (hot experts on the device, cold ones here).
  void attach_tier(DeviceTier& tier, int64_t layer);

 private:
  MoeOpConfig cfg_;
  GroupedExperts experts_;
  HostExperts executor_;
  LocalDispatcher dispatcher_;
  std::unique_ptr<Router> router_;
  MoeLayer layer_;
  std::unique_ptr<ExpertLora> lora_;
  std::unique_ptr<ExpertLoraAdapter> adapter_;
};

}  // namespace tiermoe::py
