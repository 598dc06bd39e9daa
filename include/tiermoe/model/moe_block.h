#pragma once
// A decoder layer's sparse MoE block (Qwen3MoeSparseMoeBlock, Mixtral's
// block_sparse_moe, OLMoE's, Qwen2-MoE's and GLM-4.5's routed experts): a
// Router (softmax top-k; GLM-4.5: DeepSeek-V3's sigmoid group-limited one),
// E SwiGLU experts in GroupedExperts run by HostExperts, wired through a
// MoeLayer. The router renormalises the top-K weights iff
// config.renormalize_topk(). A shared expert is the decoder layer's.
//
// The block owns its parts and the MoeLayer points into them, so it is
// neither copied nor moved (DecoderLayer holds it by unique_ptr).
//
// Expert parallelism (an AllToAllDispatcher over P ranks): the router is
// whole, the block holds experts [first_expert(), first_expert() + E/P) and
// their LoRA adapters; the others live on the other ranks.
#include <memory>
#include <string>

#include "tiermoe/io/model_config.h"
#include "tiermoe/model/expert_lora_adapter.h"
#include "tiermoe/model/lora.h"
#include "tiermoe/model/weight.h"
#include "tiermoe/moe/dispatch.h"
#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/experts.h"
#include "tiermoe/moe/moe_layer.h"
#include "tiermoe/moe/router.h"

namespace tiermoe {

class MoeBlock {
 public:
  // `name` is the HF module path ("model.layers.3.mlp"), used in errors.
  MoeBlock(const ModelConfig& config, DType compute, const Dispatcher& dispatcher,
           std::string name, MatrixAlloc alloc = MatrixAlloc::zeroed);
  ~MoeBlock();
  MoeBlock(const MoeBlock&) = delete;
  MoeBlock& operator=(const MoeBlock&) = delete;

  // y_TD = moe(x_TD). With the experts frozen, or no backward to follow
  // (weight_grads false), the forward keeps only what dx needs (plus the
  // experts' LoRA saves when they are adapted and a backward follows).
  Tensor forward(const Tensor& x_TD, MoeSaved& saved, bool weight_grads = true);
  // dx_TD (=, or += with accumulate); dlogits_extra_TE (the aux loss's
  // gradient on this layer's router logits) may be undefined. Router grads
  // always accumulate; expert grads when the experts require grad.
  void backward(Tensor& dx_TD, const Tensor& dy_TD, MoeSaved& saved,
                const Tensor& dlogits_extra_TE, bool accumulate = false);

  Router& router() { return router_; }
  GroupedExperts& experts() { return experts_; }          // this rank's (local index e)
  const GroupedExperts& experts() const { return experts_; }
  int64_t first_expert() const { return first_expert_; }  // global index of local expert 0
  MoeLayer& layer() { return layer_; }
  HostExperts& host_executor() { return executor_; }
  // Runs the experts on `executor` (e.g. the device tier's) from the next forward.
  void set_executor(ExpertExecutor& executor) { layer_.set_experts(executor); }
  void set_moe_options(AbsorbScores absorb, const MoeRegionKeep& keep);
  // Per-expert LoRA on the projections `config` names among gate_proj,
  // up_proj and down_proj (none named: nothing happens), initialised from
  // `rng`; hooked into the experts (GroupedExperts::set_adapter).
  void enable_lora(const LoraConfig& config, Rng& rng);
  ExpertLora* lora() { return lora_.get(); }
  bool router_requires_grad() const { return router_grad_; }
  bool experts_requires_grad() const { return experts_grad_; }
  void set_router_requires_grad(bool on);
  // Frozen experts: the MoE forward keeps only what dx needs and backward
  // computes dx only; their gradients are dropped.
  void set_experts_requires_grad(bool on);

 private:
  Router router_;
  GroupedExperts experts_;
  int64_t first_expert_, total_experts_;
  HostExperts executor_;
  MoeLayer layer_;
  bool router_grad_ = true;
  bool experts_grad_ = true;
  std::unique_ptr<ExpertLora> lora_;
  std::unique_ptr<ExpertLoraAdapter> hook_;
};

}  // namespace tiermoe
