#pragma once
// Grouped-query attention (self_attention.h's first kind): the self-attention
// block of a Qwen3-MoE / OLMoE / Mixtral / Qwen2-MoE / GLM-4.5 / gpt-oss
// decoder layer (as transformers' modeling files compute it), over B
// sequences of T tokens at positions 0..T-1:
//
//   q = x Wq^T (+bq)  [B*T, H*P]      k, v = x Wk^T (+bk), x Wv^T (+bv)  [B*T, Hkv*P]
//   q, k = RMSNorm_q(q), RMSNorm_k(k)  per head over P (Qwen3; Qwen3.5's by 1 + w),
//                                      over the whole projection (OLMoE), or none (Mixtral)
//   q, k = rope(q), rope(k)            rotate-half, theta = rope_theta, on each head's
//                                      first rotary_dim() values (GLM-4.5: half)
//   o    = causal GQA SDPA(q, k, v)    [B, T, H, P], within each packed document
//                                      (gpt-oss: a learned sink logit per head, and
//                                      on its sliding layers a window of keys)
//   o    = o * sigmoid(gate)           Qwen3.5's output gate: q_proj gives each head
//                                      [q | gate], P values each
//   y    = o Wo^T (+bo)
// (biases: all four with attention_bias, q/k/v only with Qwen2-MoE's qkv_bias)
//
// LoRA (lora.h) on q/k/v/o_proj adds each branch right after its projection
// (bias included), before the q/k norm, as PEFT wraps each nn.Linear.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "tiermoe/kernels/attention.h"
#include "tiermoe/model/adapted_linear.h"
#include "tiermoe/model/self_attention.h"

namespace tiermoe {

class AttentionBlock final : public SelfAttention {
 public:
  // Zero weights; the loader or a test fills them through the Weights.
  // `layer` picks the layer's attention window (ModelConfig::attention_window).
  AttentionBlock(const ModelConfig& config, int64_t layer, DType compute,
                 MatrixAlloc alloc = MatrixAlloc::zeroed);

  void forward(Tensor& y_TD, const Tensor& x_TD, const RopeTables& rope,
               AttentionSaved& saved) const override;
  void backward(Tensor& dx_TD, const Tensor& dy_TD, const RopeTables& rope,
                const AttentionSaved& saved, bool accumulate) override;
  // q, k, v, o_proj's weights, their biases, the q/k norms, the sinks.
  std::vector<std::pair<std::string, Weight*>> weights() override;
  // On q, k, v and o_proj.
  void enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) override;
  std::vector<LoraAdapter*> lora_adapters() override;

 private:
  // The batch's documents, this layer's window and sinks, as the kernel reads them.
  AttentionOptions attention_options(const RopeTables& rope) const;

  QkNorm qk_norm_;
  RmsNormCast norm_cast_;  // the q/k norms' (the family's)
  bool output_gate_;       // Qwen3.5's sigmoid gate on the output (saved.z holds it)
  DType compute_;  // the projections may be stored narrower (linear.h)
  int64_t H_, Hkv_, P_;
  double eps_;
  Linear q_proj_, k_proj_, v_proj_, o_proj_;
  Weight q_norm_, k_norm_;  // (P) per head, (H*P) / (Hkv*P) whole; undefined for none
  Weight sinks_;            // (H) gpt-oss's sink logits; undefined for the other families
  int64_t window_ = 0;      // keys a query sees back to; 0: all
  std::array<std::unique_ptr<LoraAdapter>, 4> lora_;  // q, k, v, o; null when not adapted
};

}  // namespace tiermoe
