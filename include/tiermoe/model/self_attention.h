#pragma once
// The seam between a decoder layer and its attention kind. One interface,
// three kinds:
//   - grouped-query attention (attention_block.h): Qwen3-MoE, Mixtral, OLMoE,
//     Qwen2-MoE, GLM-4.5, and gpt-oss with its sinks and sliding window;
//   - multi-head latent attention (mla_attention.h): DeepSeek-V3, Kimi-K2;
//   - Gated DeltaNet's linear attention (gated_deltanet.h): Qwen3.5-MoE's
//     linear_attention layers (its full_attention layers are GQA's).
// make_self_attention picks the kind from the family's spec (io/family.h),
// so a new family is its spec file, its presets and at most one new kind here.
//
// Forward keeps what backward reads in an AttentionSaved; backward reads it
// in reverse. Parameter grads accumulate (+=) unless frozen.
#include <array>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tiermoe/core/step_times.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/kernels/rmsnorm.h"
#include "tiermoe/model/lora.h"
#include "tiermoe/model/rope_frequencies.h"
#include "tiermoe/model/weight.h"

namespace tiermoe {

// Where the family's RMSNorm rounds (kernels/rmsnorm.h).
inline RmsNormCast rmsnorm_cast(const ModelConfig& c) {
  if (c.spec().zero_centred_norms) return RmsNormCast::unit_offset;
  return c.spec().norm_cast_after_weight ? RmsNormCast::after_weight : RmsNormCast::after_normalize;
}

// The batch's token layout as attention reads it: RoPE cos/sin [B*T, Pr]
// (activation dtype; Pr = ModelConfig::rotary_dim(), the head dim P unless
// the rotary is partial, MLA's rope width; YaRN's frequencies and scale when
// the config asks) at each token's position, and, for packed documents,
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

// What forward keeps for backward; each kind fills the fields it names.
struct AttentionSaved {
  Tensor x_TD;                 // block input (the normed hidden state)
  Tensor q_raw, k_raw;         // GQA, Gated DeltaNet: q and k before their norm; MLA: the latents
  Tensor rstd_q, rstd_k;       // those norms' statistics
  Tensor q_latent, kv_latent;  // MLA: the normed latents (q_b_proj's and kv_b_proj's inputs)
  Tensor q, k, v;              // [B, T, H(kv), P(v)] as attention read them (after norm, rope)
  Tensor lse_BTH;              // attention log-sum-exp
  Tensor o_TX;                 // attention output [B*T, H*Pv] (o_proj's input)
  std::array<Tensor, 5> u_TR;  // LoRA intermediates, one per adapted projection
  // The output gate's input and what it gates (Gated DeltaNet: the rule's
  // output; gated GQA: attention's, o_TX being the gated one).
  Tensor z, core;
  // Gated DeltaNet (q, k are the l2-normalised ones): the conv's input,
  // in_proj_b's and in_proj_a's outputs, the rule's g and beta and the gated
  // norm's statistics.
  Tensor conv_in, b_proj, a_proj, g, beta, rstd_core;
  void clear() { *this = AttentionSaved(); }
};

class SelfAttention {
 public:
  virtual ~SelfAttention() = default;

  // y_TD = attention(x_TD), x_TD [B*T, D]; `rope` holds B and T.
  virtual void forward(Tensor& y_TD, const Tensor& x_TD, const RopeTables& rope,
                       AttentionSaved& saved) const = 0;
  // dx_TD (=, or += with accumulate); parameter grads +=.
  virtual void backward(Tensor& dx_TD, const Tensor& dy_TD, const RopeTables& rope,
                        const AttentionSaved& saved, bool accumulate) = 0;

  // (HF suffix "q_proj.weight", ...) -> Weight, in checkpoint order.
  virtual std::vector<std::pair<std::string, Weight*>> weights() = 0;

  // Adapters for the projections `config` targets; `prefix` is the module
  // path ("model.layers.0.self_attn."). A drawn from `rng` in projection order.
  virtual void enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) = 0;
  virtual std::vector<LoraAdapter*> lora_adapters() = 0;  // the adapted ones, in that order

  // Where forward and backward add their wall time: projections (LoRA
  // included), norms (the q/k or latent norms and RoPE) and attention (the core).
  void set_step_times(StepTimes* times) { times_ = times; }

 protected:
  StepTimes* times_ = nullptr;
};

// The config's attention kind for decoder layer `layer`, zero weights (the
// loader or a test fills them through weights()).
std::unique_ptr<SelfAttention> make_self_attention(const ModelConfig& config, int64_t layer,
                                                   DType compute,
                                                   MatrixAlloc alloc = MatrixAlloc::zeroed);

}  // namespace tiermoe
