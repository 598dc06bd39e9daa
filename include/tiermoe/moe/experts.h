#pragma once
// GroupedExperts: E gated MLP experts stored as two stacked weights, and the
// math of one expert over a block of its rows (forward and backward twins).
//
//   h_M2F = x_MD . w13_e^T (+ b13_e)           (2F, D) per expert, W [out, in]
//   a_MF  = act(h_M2F)                          swiglu: gate rows [0, F) then up rows [F, 2F)
//                                               gpt_oss: rows interleaved, 2i gate, 2i+1 up
//   a'_MF = T(fp32(a_MF) * score_M)             only when router scores are absorbed
//   y_MD  = a'_MF . w2_e^T (+ score_M * b2_e)   (D, F) per expert
//   y_MD  = rmsnorm(y_MD) * norm_e              optional output postprocess
//
// Storage: every expert weight is [out, in] as in nn.Linear and y = x W^T.
// Hugging Face's fused GPT-OSS tensors are x-major ([E, H, 2I] gate_up_proj,
// [E, I, H] down_proj, used as x @ W): a loader transposes each expert's matrix
// into this layout and keeps the interleaved gate/up order (our w13 row 2i is
// HF's gate_up_proj[e][:, 2i]). Qwen3/Mixtral/DeepSeek experts map directly
// (gate rows, then up rows, as transformers v5's fused gate_up_proj).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/kernels/quant.h"
#include "tiermoe/kernels/quant_image.h"
#include "tiermoe/moe/expert_ops.h"

namespace tiermoe {

enum class ExpertActivation { swiglu, gpt_oss };
std::string_view expert_activation_name(ExpertActivation a);

// Which kernel family the expert GEMMs and SwiGLU use: cpu:: (fast) or ref::
// (the plain-loop oracle; row-count invariant by construction).
enum class KernelSet { cpu, ref };

struct ExpertsConfig {
  int64_t num_experts = 0;  // E
  int64_t hidden = 0;       // D
  int64_t ffn = 0;          // F
  ExpertActivation activation = ExpertActivation::swiglu;
  GptOssActivation gpt_oss;  // alpha, limit (gpt_oss only)
  bool bias = false;         // b13_E2F and b2_ED (GPT-OSS carries both)
  // Output postprocess: a per-expert RMSNorm over D with a weight. It is
  // scale-invariant, so it forbids absorbing the router score before W2.
  bool post_norm = false;
  double norm_eps = 1e-6;
  KernelSet kernels = KernelSet::cpu;
  // Weight gradients sum over an expert's rows in blocks of this many rows
  // (moe/expert_math.h); the device tier's largest bucket is this size, so
  // every tier sums the same products in the same order.
  int64_t dw_row_block = 512;
  void validate(std::string_view where = "experts") const;
};

// How quantized experts hold W13 and W2 (kernels/quant_image.h): one
// layout each for all of a layer's experts, which is what a device
// compiles its graphs for.
struct ExpertQuant {
  QuantLayout w13, w2;
  auto operator<=>(const ExpertQuant&) const = default;
  std::string str() const;  // "w13 int4 g128, w2 int4 g128"
};

// The three linear maps of a gated expert, as Hugging Face names them
// (gate_proj, up_proj: the w13 row halves; down_proj: w2).
enum class ExpertLinear { gate, up, down };

// A low-rank adapter (LoRA) on the experts' linear maps. The model module's
// ExpertLora implements it; GroupedExperts only calls it, at fixed points:
//   gate, up: on the W13 output columns [0, F) and [F, 2F), right after the
//             W13 GEMM and bias, before the activation (input x_MD);
//   down:     on the W2 output, right after the W2 GEMM and bias, before the
//             postprocess (input: the W2 input a' = T(a * score) when absorbed).
// forward_rows adds the branch into y_MY and writes u_MR (the adapter's
// intermediate, [M, rank()] in dtype(), kept for backward); backward_rows
// adds the branch's input gradient into dx_MI and accumulates the adapter's
// own gradients. Calls for different experts may run concurrently.
class ExpertAdapter {
 public:
  virtual ~ExpertAdapter() = default;
  virtual bool adapts(ExpertLinear p) const = 0;
  virtual int64_t rank() const = 0;
  virtual DType dtype() const = 0;  // of u_MR
  virtual void forward_rows(ExpertLinear p, int64_t e, Tensor& y_MY, Tensor& u_MR,
                            const Tensor& x_MI) const = 0;
  virtual void backward_rows(ExpertLinear p, int64_t e, Tensor& dx_MI, const Tensor& dy_MY,
                             const Tensor& x_MI, const Tensor& u_MR) = 0;
};

// One expert's rows of the saved activations (row views of the N-row buffers).
struct ExpertRowsActs {
  Tensor x_MD;     // input rows; undefined when no weight grads are wanted
  Tensor h_M2F;    // W13 output, pre-activation
  Tensor a_MF;     // activation, NOT scaled by the score
  Tensor ypre_MD;  // W2 output before the postprocess (post_norm only)
  Tensor rstd_M;   // postprocess statistics, acc dtype (post_norm only)
  // The adapter's intermediates [M, R] per adapted map (undefined otherwise,
  // and in a backward that wants no adapter gradients). gate and up are W13
  // products, down a W2 product.
  Tensor lora_gate_MR, lora_up_MR, lora_down_MR;
};

struct ExpertWeights;
struct ExpertGrads;
struct ExpertMath;
class ExpertPacks;

class GroupedExperts {
 public:
  // Weights are zero; fill them through param(). Weights and biases are stored
  // in `dtype`, gradients in acc_t (f32 for bf16 runs, as fp32 master grads).
  // Gradients are allocated on first use, so frozen experts never hold them.
  // With `unbound_weights` w13 and w2 get no memory: bind_weights or
  // bind_expert_weights must give every expert its weights before use.
  GroupedExperts(ExpertsConfig cfg, DType dtype, std::string name = "experts",
                 bool unbound_weights = false);

  const ExpertsConfig& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  DType grad_dtype() const;
  const std::string& name() const { return name_; }
  bool has_output_postprocess() const { return cfg_.post_norm; }

  // Frozen experts can read w13 and w2 where they are stored: a checkpoint's
  // memory-mapped bytes, or a copy at the checkpoint's width, which may be
  // narrower than dtype() (bf16 weights in an f32 run: the GEMMs then run on
  // kernels/matmul_mixed.h, whose results are those of the widened weight).
  // All experts at once as stacked tensors ([E, 2F, D] and [E, D, F]), or
  // one expert at a time ([2F, D] and [D, F]); after the latter, param("w13")
  // and param("w2") are an Error and weights(e) returns the bound tensors.
  void bind_weights(Tensor w13_EFD, Tensor w2_EDF);
  void bind_expert_weights(int64_t e, Tensor w13_FD, Tensor w2_DF);
  bool weights_per_expert() const { return !w13_e_.empty(); }
  // Frozen experts kept at a low-bit width (kernels/quant.h): W13 [2F, D]
  // and W2 [D, F] of each expert. The grouped kernels read the codes as
  // stored; weights(e) gives dequantized copies in dtype(), made on each
  // call, to the paths that read tensors (an adapter's per-expert products,
  // the device tier's uploads, f64 runs); param("w13") is an Error. Drops
  // the weights bound before.
  void bind_quantized_weights(std::vector<QuantMatrix> w13_E_FD, std::vector<QuantMatrix> w2_E_DF);
  bool quantized() const { return !q13_.empty(); }
  const QuantMatrix& quantized_w13(int64_t e) const { return q13_[size_t(e)]; }
  const QuantMatrix& quantized_w2(int64_t e) const { return q2_[size_t(e)]; }
  // Their layouts (none unless quantized).
  std::optional<ExpertQuant> quant() const;
  // The bytes the experts' W13 and W2 hold: stored codes and scales when
  // quantized, else the bound tensors' (a mapped checkpoint's included).
  int64_t weight_bytes() const;
  // Expert e has weights to read: stacked ones with memory, or its own bound.
  // An unbound placeholder has a shape and a dtype only; whoever reads the
  // bytes (the packs, the device tier's uploads) checks this first.
  bool weights_bound(int64_t e) const;

  // "w13" [E, 2F, D], "w2" [E, D, F]; with bias "b13" [E, 2F], "b2" [E, D];
  // with post_norm "norm" [E, D]. The mutable access counts as a change of
  // the weights (weights_version()).
  std::vector<std::string> param_names() const;
  Tensor& param(std::string_view name);
  const Tensor& param(std::string_view name) const;
  // param(name), except for W13 and W2 of quantized experts: a placeholder
  // of their widened stacked shape and dtype, with no memory (they are
  // frozen; parameter listings show it, nothing may read it).
  const Tensor& param_or_placeholder(std::string_view name) const;
  Tensor& grad(std::string_view name);  // same shape, grad_dtype(); accumulated with +=
  const Tensor& grad(std::string_view name) const;  // Error before the grads exist
  void zero_grad();
  bool has_grads() const { return dw13_EFD.defined(); }
  void allocate_grads();  // zeroed; no-op when they exist (not thread-safe: call before a parallel backward)
  void free_grads();      // frozen for good: drop them

  // The weights' packed copies for the grouped kernels (moe/expert_kernels.h)
  // follow this version: it moves on every mutable param() access and on
  // weights_changed(), which whoever updates the weights in place through a
  // held tensor (the optimizer step) must call.
  uint64_t weights_version() const { return weights_version_; }
  void weights_changed() { ++weights_version_; }
  ExpertPacks& packs() const { return *packs_; }

  // A LoRA adapter on the experts (not owned; null removes it). It knows
  // which of W13's output columns are gate_proj's and up_proj's.
  void set_adapter(ExpertAdapter* adapter);
  ExpertAdapter* adapter() const { return adapter_; }
  bool adapts(ExpertLinear p) const { return adapter_ && adapter_->adapts(p); }

  // Expert e's weights (views), its accumulated grads (views; allocated on
  // first use) and its math (moe/expert_math.h) with the adapter hooked in.
  ExpertWeights weights(int64_t e) const;
  ExpertGrads grads(int64_t e);
  ExpertMath math(int64_t e) const;
  // The same without W13 and W2 (undefined in it): the steps around the
  // grouped products (biases, activation, score, weight-gradient sums) read
  // neither, and quantized experts are not dequantized for them.
  ExpertMath math_without_matrices(int64_t e) const;

  // Expert e over M rows. acts.h_M2F and acts.a_MF (and ypre_MD, rstd_M with
  // post_norm) are outputs the caller allocated; acts.x_MD is only read by
  // backward. score_M (score dtype) defined = absorbed; padded rows carry 0.
  void forward_rows(int64_t e, Tensor& y_MD, ExpertRowsActs& acts, const Tensor& x_MD,
                    const Tensor& score_M) const;
  // forward_rows's three stages, which it runs in this order; a remat replay
  // re-runs only those whose products backward lacks.
  //   w13: h_M2F = x_MD . w13_e^T (+ b13_e) [+ gate/up adapters; writes
  //        acts.lora_gate_MR / lora_up_MR]
  //   act: a_MF = act(h_M2F)
  //   w2:  y_MD = [postprocess](T(a_MF * score_M) . w2_e^T (+ score_M * b2_e) [+ down
  //        adapter]); reads acts.a_MF, writes acts.ypre_MD and acts.rstd_M with
  //        post_norm, acts.lora_down_MR with a down adapter
  void w13_forward_rows(int64_t e, ExpertRowsActs& acts, const Tensor& x_MD) const;
  void act_forward_rows(Tensor& a_MF, const Tensor& h_M2F) const;
  void w2_forward_rows(int64_t e, Tensor& y_MD, ExpertRowsActs& acts, const Tensor& score_M) const;
  // dx_MD is written; dscore_M (absorbed only) is written; with weight_grads
  // the call's weight-gradient sum (moe/expert_math.h) is added to the
  // expert's grads and acts.x_MD must be defined.
  // acts.a_MF is read only with weight_grads, an absorbed score or a down
  // adapter. The adapter's backward runs for each map whose intermediate
  // acts carries (gate/up then also read acts.x_MD).
  void backward_rows(int64_t e, Tensor& dx_MD, Tensor& dscore_M, const Tensor& dy_MD,
                     const ExpertRowsActs& acts, const Tensor& score_M, bool weight_grads);

 private:
  ExpertsConfig cfg_;
  DType dtype_;
  std::string name_;
  Tensor w13_EFD;  // (E, 2F, D) gate rows then up rows (gpt_oss: interleaved)
  Tensor w2_EDF;   // (E, D, F)
  Tensor b13_E2F;  // (E, 2F) bias only
  Tensor b2_ED;    // (E, D) bias only
  Tensor norm_ED;  // (E, D) post_norm only
  std::vector<Tensor> w13_e_, w2_e_;  // per-expert bound weights (bind_expert_weights)
  std::vector<QuantMatrix> q13_, q2_;  // quantized weights (bind_quantized_weights)
  Tensor dw13_EFD, dw2_EDF, db13_E2F, db2_ED, dnorm_ED;  // grad_dtype()
  ExpertAdapter* adapter_ = nullptr;
  uint64_t weights_version_ = 0;
  std::shared_ptr<ExpertPacks> packs_;
};

}  // namespace tiermoe
