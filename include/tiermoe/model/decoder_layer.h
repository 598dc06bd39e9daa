#pragma once
// One pre-norm decoder layer:
//   h   = x + attn(input_layernorm(x))              attn: self_attention.h's kinds
//   out = h + mlp(post_attention_layernorm(h))       mlp: dense SwiGLU or sparse MoE
//                                                    (+ a shared expert: shared_expert.h)
// Backward is the same in reverse: the residual stream's gradient passes
// straight through each add and each norm's dx is added onto it.
#include <memory>
#include <string>

#include "tiermoe/io/model_config.h"
#include "tiermoe/kernels/rmsnorm.h"
#include "tiermoe/model/dense_mlp.h"
#include "tiermoe/model/moe_block.h"
#include "tiermoe/model/self_attention.h"
#include "tiermoe/model/shared_expert.h"

namespace tiermoe {

struct DecoderLayerSaved {
  Tensor x_TD, rstd_in_T;  // input_layernorm's input and statistics
  AttentionSaved attn;
  Tensor h_TD, rstd_post_T;  // post_attention_layernorm's input and statistics
  DenseMlpSaved mlp;
  MoeSaved moe;
  SharedExpertSaved shared;
};

// Wall time a layer's halves took, forward and backward added, since the
// layer was built: the step-time split of train --metrics reads differences.
struct LayerTimes {
  double attention_s = 0;  // the attention block (projections, RoPE, attention)
  double mlp_s = 0;        // the MoE block (routing, dispatch, experts, combine) or dense MLP
};

class DecoderLayer {
 public:
  DecoderLayer(const ModelConfig& config, int64_t layer, DType compute,
               const Dispatcher& dispatcher, MatrixAlloc alloc = MatrixAlloc::zeroed);

  int64_t index() const { return layer_; }
  bool is_moe() const { return moe_ != nullptr; }
  // "model.layers.{i}."
  const std::string& prefix() const { return prefix_; }
  // The attention's module path: "model.layers.{i}.self_attn" (Gated
  // DeltaNet's: "...linear_attn").
  const std::string& attention_name() const { return attention_name_; }
  // The MLP's module path: "model.layers.{i}.mlp" (Mixtral's MoE: "...block_sparse_moe").
  const std::string& mlp_name() const { return mlp_name_; }

  // LoRA on the attention projections, then the dense MLP's, or the shared
  // expert's and the routed experts' (CausalLM::enable_lora), A drawn from
  // `rng` in that order.
  void enable_lora(const LoraConfig& config, Rng& rng);
  std::vector<LoraAdapter*>
  lora_adapters();  // attention's, then the dense MLP's or shared expert's

  // weight_grads = false: no backward with weight gradients follows (evaluation).
  // A NaN/Inf after the attention or the MLP half is an Error naming it
  // ("model.layers.3.self_attn output"; check_finite_activation).
  Tensor forward(const Tensor& x_TD, const RopeTables& rope, DecoderLayerSaved& saved,
                 bool weight_grads = true);
  // dx_TD is written. dlogits_extra_TE: the aux loss's gradient on this
  // layer's router logits (MoE layers; may be undefined).
  void backward(Tensor& dx_TD, const Tensor& dout_TD, const RopeTables& rope,
                DecoderLayerSaved& saved, const Tensor& dlogits_extra_TE = Tensor());

  SelfAttention& attention() { return *attn_; }
  Weight& input_layernorm() { return norm_in_; }
  Weight& post_attention_layernorm() { return norm_post_; }
  DenseMlp* dense_mlp() { return mlp_.get(); }
  MoeBlock* moe() { return moe_.get(); }
  const MoeBlock* moe() const { return moe_.get(); }
  SharedExpert* shared_expert() { return shared_.get(); }  // MoE layers of Qwen2-MoE, GLM-4.5
  // Its module path ("model.layers.3.mlp.shared_expert"); empty without one.
  const std::string& shared_expert_name() const { return shared_name_; }
  const LayerTimes& times() const { return times_; }
  // Where the layer's parts add their wall time (StepPart): its norms and
  // residual adds, the attention block's and the MLP's parts.
  void set_step_times(StepTimes* times);

 private:
  int64_t layer_;
  std::string prefix_, attention_name_, mlp_name_;
  double eps_;
  RmsNormCast norm_cast_;
  Weight norm_in_, norm_post_;  // (D)
  std::unique_ptr<SelfAttention> attn_;  // the config's attention kind
  std::unique_ptr<DenseMlp> mlp_;  // exactly one of mlp_ and moe_
  std::unique_ptr<MoeBlock> moe_;
  std::unique_ptr<SharedExpert> shared_;  // beside moe_, when the config has one
  std::string shared_name_;               // its module path ("model.layers.3.mlp.shared_expert")
  LayerTimes times_;
  StepTimes* step_times_ = nullptr;
};

}  // namespace tiermoe
