#pragma once
// The self-attention block of a Qwen3-MoE / OLMoE / Mixtral / Qwen2-MoE decoder layer
// (as transformers' modeling files compute it), over B sequences of T tokens
// at positions 0..T-1:
//
//   q = x Wq^T (+bq)  [B*T, H*P]      k, v = x Wk^T (+bk), x Wv^T (+bv)  [B*T, Hkv*P]
//   q, k = RMSNorm_q(q), RMSNorm_k(k)  per head over P (Qwen3), over the whole
//                                      projection (OLMoE), or none (Mixtral)
//   q, k = rope(q), rope(k)            rotate-half, theta = rope_theta, on each head's
//                                      first rotary_dim() values (GLM-4.5: half)
//   o    = causal GQA SDPA(q, k, v)    [B, T, H, P], within each packed document
//                                      (gpt-oss: a learned sink logit per head, and
//                                      on its sliding layers a window of keys)
//   y    = o Wo^T (+bo)
// (biases: all four with attention_bias, q/k/v only with Qwen2-MoE's qkv_bias)
//
// Forward keeps what backward reads in an AttentionSaved; backward reads it
// in reverse. Parameter grads accumulate (+=) unless frozen.
//
// LoRA (lora.h) on q/k/v/o_proj adds each branch right after its projection
// (bias included), before the q/k norm, as PEFT wraps each nn.Linear.
#include <array>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tiermoe/core/step_times.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/kernels/attention.h"
#include "tiermoe/model/linear.h"
#include "tiermoe/model/lora.h"
#include "tiermoe/model/rope_frequencies.h"

namespace tiermoe {

// The batch's token layout as attention reads it: RoPE cos/sin [B*T, Pr]
// (activation dtype; Pr = ModelConfig::rotary_dim(), the head dim P unless
// the rotary is partial; YaRN's frequencies and scale when the config asks)
// at each token's position, and, for packed documents,
// each token's document start (kernels/attention.h; empty: one document per
// row, positions 0..T-1).
struct RopeTables {
  int64_t B = 0, T = 0;
  Tensor cos_RP, sin_RP;
  std::vector<int32_t> doc_start_BT;
  // positions_BT empty: 0..T-1 in every row.
  static RopeTables make(int64_t B, int64_t T, const RopeFrequencies& freqs, DType dtype,
                         std::span<const int32_t> positions_BT = {},
                         std::span<const int32_t> doc_start_BT = {});
};

struct AttentionSaved {
  Tensor x_TD;               // block input (the normed hidden state)
  Tensor q_raw, k_raw;       // projections before the q/k norm (norm backward)
  Tensor rstd_q, rstd_k;     // q/k norm statistics
  Tensor q, k, v;            // [B, T, H(kv), P] as attention read them (after norm, rope)
  Tensor lse_BTH;            // attention log-sum-exp
  Tensor o_TX;               // attention output [B*T, H*P] (o_proj's input)
  std::array<Tensor, 4> u_TR;  // LoRA intermediates of q, k, v, o_proj (adapted ones only)
  void clear() { *this = AttentionSaved(); }
};

class AttentionBlock {
 public:
  // Zero weights; the loader or a test fills them through the Weights.
  // `layer` picks the layer's attention window (ModelConfig::attention_window).
  AttentionBlock(const ModelConfig& config, int64_t layer, DType compute,
                 MatrixAlloc alloc = MatrixAlloc::zeroed);

  // y_TD = attention(x_TD), x_TD [B*T, D]; `rope` holds B and T.
  void forward(Tensor& y_TD, const Tensor& x_TD, const RopeTables& rope, AttentionSaved& saved) const;
  // dx_TD (=, or += with accumulate); parameter grads +=.
  void backward(Tensor& dx_TD, const Tensor& dy_TD, const RopeTables& rope,
                const AttentionSaved& saved, bool accumulate = false);

  // (HF suffix "q_proj.weight", ...) -> Weight, in checkpoint order.
  std::vector<std::pair<std::string, Weight*>> weights();

  // Adapters for the projections `config` targets; `prefix` is the module
  // path ("model.layers.0.self_attn."). A drawn from `rng` in q, k, v, o order.
  void enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng);
  std::vector<LoraAdapter*> lora_adapters();  // q, k, v, o (the adapted ones)

  // Where forward and backward add their wall time: projections (LoRA
  // included), norms (the q/k norms and RoPE) and attention (the core).
  void set_step_times(StepTimes* times) { times_ = times; }

 private:
  // The batch's documents, this layer's window and sinks, as the kernel reads them.
  AttentionOptions attention_options(const RopeTables& rope) const;
  // y_MO += the LoRA branch of projection i (0..3: q, k, v, o), if adapted.
  void lora_forward(int i, Tensor& y_MO, const Tensor& x_MI, AttentionSaved& saved) const;
  void lora_backward(int i, Tensor& dx_MI, const Tensor& dy_MO, const Tensor& x_MI,
                     const AttentionSaved& saved);

  QkNorm qk_norm_;
  DType compute_;  // the projections may be stored narrower (linear.h)
  int64_t H_, Hkv_, P_;
  double eps_;
  Linear q_proj_, k_proj_, v_proj_, o_proj_;
  Weight q_norm_, k_norm_;  // (P) per head, (H*P) / (Hkv*P) whole; undefined for none
  Weight sinks_;            // (H) gpt-oss's sink logits; undefined for the other families
  int64_t window_ = 0;      // keys a query sees back to; 0: all
  std::array<std::unique_ptr<LoraAdapter>, 4> lora_;  // q, k, v, o; null when not adapted
  StepTimes* times_ = nullptr;
};

}  // namespace tiermoe
