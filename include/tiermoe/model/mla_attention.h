#pragma once
// Multi-head latent attention (self_attention.h's second kind): DeepSeek-V3's
// and Kimi-K2's attention as transformers' DeepseekV3Attention computes it,
// over B sequences of T tokens (N = B*T), H heads, a q/k head of
// Q = Qn + Qr values (qk_nope_head_dim + qk_rope_head_dim), a v head of Pv:
//
//   q      = q_b_proj(RMSNorm(q_a_proj(x)))   [N, H*Q]  through the q latent
//                                                        (Rq = q_lora_rank), or
//          = q_proj(x)                                   when q_lora_rank is null
//   kv_a   = kv_a_proj_with_mqa(x)            [N, Rkv + Qr]
//   c_kv   = RMSNorm(kv_a[:, :Rkv])           the kv latent (kv_lora_rank)
//   k_rope = kv_a[:, Rkv:]                    one rope key per token, shared by every head
//   kv     = kv_b_proj(c_kv)                  [N, H*(Qn + Pv)]: per head k_nope, then v
//   q_h    = [q_nope_h | rope(q_rope_h)]      k_h = [k_nope_h | rope(k_rope)]
//   o      = causal SDPA(q, k, v), scale = attention_softmax_scale (YaRN's mscale^2)
//   y      = o_proj(o)                        [N, D]
//
// RoPE turns the Qr rope dims with rotate-half. With rope_interleave the
// projections lay those dims out in adjacent pairs (x0, x1), (x2, x3), ...;
// transformers rotates each pair, which equals de-interleaving them (evens,
// then odds) and then rotate-half, the order attention then sees. Both
// latent norms use eps 1e-6 (transformers builds them without the config's
// rms_norm_eps). Biases with attention_bias: q_a_proj, kv_a_proj_with_mqa and
// o_proj.
//
// LoRA (lora.h) on any of q_proj / q_a_proj, q_b_proj, kv_a_proj_with_mqa,
// kv_b_proj and o_proj adds each branch right after its projection, as PEFT
// wraps each nn.Linear.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "tiermoe/kernels/attention.h"
#include "tiermoe/model/adapted_linear.h"
#include "tiermoe/model/self_attention.h"

namespace tiermoe {

class MlaAttention final : public SelfAttention {
 public:
  MlaAttention(const ModelConfig& config, DType compute, MatrixAlloc alloc = MatrixAlloc::zeroed);

  void forward(Tensor& y_TD, const Tensor& x_TD, const RopeTables& rope,
               AttentionSaved& saved) const override;
  void backward(Tensor& dx_TD, const Tensor& dy_TD, const RopeTables& rope,
                const AttentionSaved& saved, bool accumulate) override;
  // The projections' weights in the order above, their biases, the latent norms.
  std::vector<std::pair<std::string, Weight*>> weights() override;
  void enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) override;
  std::vector<LoraAdapter*> lora_adapters() override;

 private:
  // The projections, in forward order; q_b is unused without a q latent
  // (then q is q_proj).
  enum Proj { kQ, kQb, kKvA, kKvB, kO, kProjs };
  static const char* proj_name(Proj p, bool q_latent);
  bool has_q_latent() const { return Rq_ > 0; }
  // y_MO (=) projection p of x_MI, plus its LoRA branch (if adapted).
  void project(Proj p, Tensor& y_MO, const Tensor& x_MI, AttentionSaved& saved) const;
  // dx_MI (=, or += with accumulate) the transpose of project; grads +=.
  void project_backward(Proj p, Tensor& dx_MI, const Tensor& dy_MO, const Tensor& x_MI,
                        const AttentionSaved& saved, bool accumulate);

  DType compute_;
  int64_t H_, Qn_, Qr_, Pv_, Rq_, Rkv_;
  double scale_;
  bool interleave_;
  std::array<Linear, kProjs> proj_;
  Weight q_norm_, kv_norm_;  // q_a_layernorm (Rq), kv_a_layernorm (Rkv)
  std::array<std::unique_ptr<LoraAdapter>, kProjs> lora_;  // null when not adapted
};

}  // namespace tiermoe
