#pragma once
// Gated DeltaNet (self_attention.h's linear kind): Qwen3.5-MoE's and
// Qwen3-Next's linear_attention layers, as transformers'
// Qwen3_5MoeGatedDeltaNet computes them over N = B*T tokens:
//
//   qkv  = silu(conv(in_proj_qkv(x)))      [N, 2 Hk Dk + Hv Dv], the causal
//                                           depthwise conv (kernels/causal_conv.h)
//   q, k, v = qkv's column blocks          [B, T, Hk, Dk], [B, T, Hk, Dk], [B, T, Hv, Dv]
//   z    = in_proj_z(x)                    [N, Hv Dv], the output gate
//   g, beta from in_proj_a(x), in_proj_b(x), A_log, dt_bias   (kernels/gated_delta.h)
//   core = rule(l2norm(q) Dk^-0.5, l2norm(k), v, g, beta)     [B, T, Hv, Dv]
//   o    = RMSNorm(core) * silu(z)         per value head, weight [Dv]
//   y    = out_proj(o)                     [N, D]
//
// Packed documents (RopeTables::doc_start_BT) restart the conv and the rule's
// state at each document; RoPE is not used. The gated norm is
// Qwen3_5MoeRMSNormGated: the weight times the normalised core rounded to
// the compute dtype, times silu(z) in f32, rounded once more.
//
// LoRA (lora.h) on any of in_proj_qkv, in_proj_z, in_proj_b, in_proj_a and
// out_proj adds each branch right after its projection, as PEFT wraps each
// nn.Linear.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "tiermoe/model/adapted_linear.h"
#include "tiermoe/model/self_attention.h"

namespace tiermoe {

// A layer's shapes (config.json's linear_* fields and rms_norm_eps).
struct GatedDeltaNetDims {
  int64_t hidden = 0;                      // D
  int64_t key_heads = 0, key_dim = 0;      // Hk, Dk
  int64_t value_heads = 0, value_dim = 0;  // Hv (a multiple of Hk), Dv
  int64_t conv_kernel = 4;                 // K
  double norm_eps = 1e-6;
  int64_t key_width() const { return key_heads * key_dim; }
  int64_t value_width() const { return value_heads * value_dim; }
  int64_t conv_width() const { return 2 * key_width() + value_width(); }  // C
};

class GatedDeltaNet final : public SelfAttention {
 public:
  GatedDeltaNet(const GatedDeltaNetDims& dims, DType compute,
                MatrixAlloc alloc = MatrixAlloc::zeroed);

  void forward(Tensor& y_TD, const Tensor& x_TD, const RopeTables& rope,
               AttentionSaved& saved) const override;
  void backward(Tensor& dx_TD, const Tensor& dy_TD, const RopeTables& rope,
                const AttentionSaved& saved, bool accumulate) override;
  // transformers' names under the layer's linear_attn, in its order:
  // dt_bias, A_log, conv1d.weight [C, 1, K], norm.weight, the projections'.
  std::vector<std::pair<std::string, Weight*>> weights() override;
  void enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) override;
  std::vector<LoraAdapter*> lora_adapters() override;

 private:
  enum Proj { kQkv, kZ, kB, kA, kOut, kProjs };
  static const char* proj_name(Proj p);
  void project(Proj p, Tensor& y_MO, const Tensor& x_MI, AttentionSaved& saved) const;
  void project_backward(Proj p, Tensor& dx_MI, const Tensor& dy_MO, const Tensor& x_MI,
                        const AttentionSaved& saved, bool accumulate);
  // RMSNorm(core) before the gate, [N Hv, Dv] (rstd_R written when defined).
  Tensor normed_core(const Tensor& core, Tensor& rstd_R) const;

  GatedDeltaNetDims dims_;
  DType compute_;
  std::array<Linear, kProjs> proj_;
  Weight conv_;                                            // [C, 1, K] as transformers stores it
  Weight dt_bias_, A_log_;                                 // [Hv]
  Weight norm_;                                            // [Dv]
  std::array<std::unique_ptr<LoraAdapter>, kProjs> lora_;  // null when not adapted
};

}  // namespace tiermoe
