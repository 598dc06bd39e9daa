#pragma once
// LoRA with PEFT semantics (huggingface/peft's LoraLayer): a frozen linear y = x W^T gains
//
//   y_MO += scaling * (x_MI . A_RI^T) . B_OR^T,   scaling = alpha / r  (alpha / sqrt(r) with
//   rslora)
//
// with A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_, a = sqrt(5)) and B = 0,
// so a fresh adapter leaves the model unchanged.
//
// Numerics follow PEFT's default (get_peft_model autocasts adapter weights to
// fp32): A and B are fp32 (f64 in f64 runs) and are the trainable masters; the
// LoRA branch runs in that "master dtype" whatever the compute dtype T:
//   u_MR = fp32(x_MI) . A^T          (saved for backward)
//   v_MO = (u_MR . B^T) * scaling     (PEFT: lora_B(lora_A(x)) * scaling)
//   y_MO = T(fp32(y_MO) + v_MO)       (the base result, upcast, plus the branch; rounded once)
// Backward mirrors torch autograd of that graph:
//   g_MO = fp32(dy_MO) * scaling;  dB += g^T u;  du = g B;  dA += du^T fp32(x);
//   dx_MI = T(dx_MI + T(du A))        (the fp32 branch grad is cast to T, then summed)
// In f32 and f64 runs every cast is the identity.
//
// The math lives in free functions over plain tensors (forward and backward
// twins, llm.c style) so LoraAdapter (one linear) and ExpertLora (E experts,
// one slice each) share it. GEMMs run on the cpu:: matmul kernels.
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/random.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/peft.h"

namespace tiermoe {

// The linear layers LoRA may adapt, by PEFT module name: the attention
// projections (DeepSeek-V3's latent attention has its own four besides
// q_proj and o_proj, Gated DeltaNet its five), the experts' and the dense
// MLPs'. The router (`mlp.gate`) is never adapted: gate_proj does not
// match it under PEFT's rules, and "gate" is refused.
inline constexpr std::string_view kLoraTargetNames[] = {"q_proj",
                                                        "k_proj",
                                                        "v_proj",
                                                        "o_proj",
                                                        "q_a_proj",
                                                        "q_b_proj",
                                                        "kv_a_proj_with_mqa",
                                                        "kv_b_proj",
                                                        "in_proj_qkv",
                                                        "in_proj_z",
                                                        "in_proj_b",
                                                        "in_proj_a",
                                                        "out_proj",
                                                        "gate_proj",
                                                        "up_proj",
                                                        "down_proj"};

struct LoraConfig {
  int64_t rank = 8;  // R
  double alpha = 8;
  bool rslora = false;
  // PEFT module names; `--lora-rank R` alone means the attention projections.
  // Expert (and dense MLP) projections are adapted only when named. A dotted
  // name ("shared_expert.gate_proj") matches module paths ending in it, as in
  // PEFT, and never the routed experts (only a bare name adapts those).
  std::set<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  double dropout = 0.0;  // only 0 is supported
  // PEFT's layers_to_transform: only these decoder layers are adapted;
  // empty: every layer.
  std::set<int64_t> layers;

  // alpha / rank, or alpha / sqrt(rank) with rslora.
  double scaling() const;
  // Throws Error naming `where` for rank <= 0, a non-finite alpha, a nonzero
  // dropout, or an empty or invalid target set.
  void validate(std::string_view where = "lora") const;
};

// What `--lora-rank R` adapts when no targets are named: the model's attention
// projections, q_proj, k_proj, v_proj, o_proj, or under latent attention
// q_a_proj, q_b_proj (q_proj without a q latent), kv_a_proj_with_mqa,
// kv_b_proj, o_proj; with Gated DeltaNet layers (Qwen3.5) q/k/v/o_proj and
// their in_proj_qkv, in_proj_z and out_proj (not the [Hv]-wide in_proj_b/a).
std::set<std::string> lora_default_targets(const ModelConfig& config);

// Parses a comma-separated list ("q_proj, v_proj,gate_proj"). Unknown names
// throw an Error listing the valid ones; "gate", "mlp.gate" or
// "shared_expert_gate" throw an Error saying a router is never adapted.
std::set<std::string> parse_lora_targets(std::string_view list,
                                         std::string_view where = "--lora-targets");

// PEFT's list matching (tuners_utils.check_target_module_exists): the module
// path equals a target or ends with "." + target. So q_proj matches
// "model.layers.3.self_attn.q_proj" and gate_proj does not match the router
// "model.layers.3.mlp.gate".
bool lora_targets_module(const LoraConfig& config, std::string_view hf_module_path);

// adapter_config.json fields for `config`, and back. from_peft_config
// validates (dropout must be 0, targets must be valid) naming `where`.
PeftLoraConfig to_peft_config(const LoraConfig& config, std::string base_model_name);
LoraConfig from_peft_config(const PeftLoraConfig& peft, std::string_view where);

// The dtype A, B and their grads use in a run of compute dtype `compute`:
// f64 for f64, f32 otherwise.
DType lora_master_dtype(DType compute);

// Columns of a wider output that one adapter owns: columns begin,
// begin + stride, ... (O of them). The default is the whole row. The experts'
// fused w13 output [M, 2F] takes gate_proj at {0, 1} and up_proj at {F, 1}
// (GPT-OSS's interleaved layout would be {0, 2} and {1, 2}).
struct LoraColumns {
  int64_t begin = 0;
  int64_t stride = 1;
};

// A ~ U(-1/sqrt(in), 1/sqrt(in)) drawn from `rng` in row-major order, B = 0.
void lora_init(Tensor& A_RI, Tensor& B_OR, Rng& rng);

// y_MY's columns `cols` (O of them) += the LoRA branch of x_MI; writes u_MR
// (master dtype, [M, R]) for backward. x and y share the compute dtype; A and
// B are in its master dtype.
void lora_forward(Tensor& y_MY, Tensor& u_MR, const Tensor& x_MI, const Tensor& A_RI,
                  const Tensor& B_OR, double scaling, LoraColumns cols = {});
// dA_RI and dB_OR (master dtype) accumulate (+=). When dx_MI is defined the
// branch's input gradient is added to it (compute dtype). dy_MY's columns
// `cols` are the gradient of the adapted output.
void lora_backward(Tensor& dx_MI, Tensor& dA_RI, Tensor& dB_OR, const Tensor& dy_MY,
                   const Tensor& x_MI, const Tensor& u_MR, const Tensor& A_RI, const Tensor& B_OR,
                   double scaling, LoraColumns cols = {});

// w_OI <- w_OI + scaling * B A, as PEFT's merge: the delta in the master
// dtype (B A, then times scaling), added in the master dtype and rounded once
// to w's dtype. So a merged f64 model matches the adapter to rounding (1e-12)
// and a merged bf16 weight is the nearest bf16 of the exact sum.
void lora_merge(Tensor& w_OI, const Tensor& A_RI, const Tensor& B_OR, double scaling);

// One adapted linear layer [out, in]. A, B and their grads are owned here
// (tags weights and grads); the optimizer wraps them as Parameters (their
// working copy is the master: no second copy).
class LoraAdapter {
 public:
  LoraAdapter(int64_t in, int64_t out, const LoraConfig& config, DType compute, std::string name);

  const std::string& name() const { return name_; }  // HF module path
  int64_t in() const { return A_RI.size(1); }
  int64_t out() const { return B_OR.size(0); }
  int64_t rank() const { return A_RI.size(0); }
  double scaling() const { return scaling_; }
  DType compute_dtype() const { return compute_; }

  void init(Rng& rng);
  void forward(Tensor& y_MY, Tensor& u_MR, const Tensor& x_MI, LoraColumns cols = {}) const;
  void backward(Tensor& dx_MI, const Tensor& dy_MY, const Tensor& x_MI, const Tensor& u_MR,
                LoraColumns cols = {});
  void merge(Tensor& w_OI) const;
  void zero_grad();

  Tensor A_RI;   // (R, in) master dtype, trainable
  Tensor B_OR;   // (out, R) master dtype, trainable
  Tensor dA_RI;  // (R, in) accumulated by backward
  Tensor dB_OR;  // (out, R)

  // PEFT export and import: views of A and B, and a checked copy from an
  // imported adapter (any stored dtype; converted to the master dtype).
  PeftLoraWeights to_peft() const { return {A_RI, B_OR}; }
  void load_peft(const PeftLoraWeights& w);

 private:
  std::string name_;
  double scaling_;
  DType compute_;
};

// Per-expert LoRA on an MoE layer's experts (PEFT's per-expert "2D" layout:
// `<prefix>.<e>.gate_proj`), for the projections the config targets among
// gate_proj [F, D], up_proj [F, D] and down_proj [D, F].
//
// Interop notes (PEFT with transformers v5, whose Qwen3-MoE experts are fused
// gate_up_proj / down_proj parameters that PEFT adapts through a conversion):
//   - PEFT refuses an adapter targeting gate_proj without up_proj; TierMoE
//     trains and exports it, but such a file loads only here.
//   - With use_rslora and expert gate_proj/up_proj targets, PEFT's fused
//     gate_up adapter is scaled as one module of rank 2r (alpha / sqrt(2r)),
//     so it applies the gate/up branches sqrt(2) too weak. TierMoE keeps the
//     per-module semantics (alpha / sqrt(r) each), which the exported
//     per-expert keys state.
enum class ExpertProj { gate, up, down };
std::string_view expert_proj_name(ExpertProj p);  // "gate_proj", "up_proj", "down_proj"

class ExpertLora {
 public:
  // `prefix` is the experts' module path, e.g. "model.layers.3.mlp.experts".
  // With expert parallelism the adapters of experts [first_expert,
  // first_expert + num_experts) of `total_experts` live here (index e here is
  // expert first_expert + e in names); total_experts 0 means num_experts.
  ExpertLora(int64_t num_experts, int64_t hidden, int64_t ffn, const LoraConfig& config,
             DType compute, std::string prefix, int64_t first_expert = 0,
             int64_t total_experts = 0);

  bool empty() const { return projs_.empty(); }  // no expert projection targeted
  bool has(ExpertProj p) const;
  const std::vector<ExpertProj>& projections() const { return projs_; }
  int64_t num_experts() const { return num_experts_; }  // held here
  int64_t first_expert() const { return first_expert_; }
  int64_t rank() const { return rank_; }
  double scaling() const { return scaling_; }
  // "<prefix>.<first_expert + e>.gate_proj"
  std::string module_path(ExpertProj p, int64_t e) const;

  // Experts in order (all total_experts of them, so each gets the values a
  // whole model would draw), gate, up, down each.
  void init(Rng& rng);
  // Expert e's rows of projection p; the same contracts as lora_forward and
  // lora_backward (u_MR saved per projection and row block).
  void forward_rows(ExpertProj p, int64_t e, Tensor& y_MY, Tensor& u_MR, const Tensor& x_MI,
                    LoraColumns cols = {}) const;
  void backward_rows(ExpertProj p, int64_t e, Tensor& dx_MI, const Tensor& dy_MY,
                     const Tensor& x_MI, const Tensor& u_MR, LoraColumns cols = {});
  void merge(ExpertProj p, int64_t e, Tensor& w_OI) const;
  void zero_grad();

  // Stacked weights and grads: A [E, R, in], B [E, out, R]. Error when p is
  // not targeted.
  Tensor& A(ExpertProj p);
  Tensor& B(ExpertProj p);
  Tensor& dA(ExpertProj p);
  Tensor& dB(ExpertProj p);
  const Tensor& A(ExpertProj p) const;
  const Tensor& B(ExpertProj p) const;

  // Adds every (expert, projection) as module_path -> views of A_e, B_e.
  void to_peft(PeftLoraModules& out) const;
  // Copies every targeted (expert, projection) from `modules`; a missing
  // module or a shape mismatch is an Error naming it.
  void load_peft(const PeftLoraModules& modules);

 private:
  struct Proj {
    ExpertProj which;
    Tensor A_ERI, B_EOR, dA_ERI, dB_EOR;
  };
  const Proj& proj(ExpertProj p) const;
  Proj& proj(ExpertProj p);

  int64_t num_experts_, first_expert_, total_experts_, rank_;
  double scaling_;
  std::string prefix_;
  std::vector<ExpertProj> projs_;
  std::vector<Proj> weights_;  // parallel to projs_
};

}  // namespace tiermoe
