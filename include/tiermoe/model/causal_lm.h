#pragma once
// The Qwen3-MoE causal LM (and the Mixtral / OLMoE / Qwen2-MoE variants ModelConfig
// describes), forward and backward, on Hugging Face semantics:
//
//   x      = embed_tokens[ids]                            [B*T, D]
//   x      = layer_l(x)  for l = 0 .. L-1                 (DecoderLayer)
//   logits = norm(x) . W_head^T                           W_head = embed_tokens when tied
//   loss   = mean cross-entropy over targets != -100
//          + router_aux_loss_coef * aux   iff output_router_logits (HF's default: off)
//
// Inputs are B sequences of T tokens at positions 0..T-1; targets are given
// already aligned (target b*T+t is the token that follows ids b*T+t), so no
// shift happens here. Compute dtype: f64 (parity mode: every step f64), f32,
// or bf16 (bf16 storage, f32 accumulation and statistics). Gradients are f32
// (f64 in f64 runs) and accumulate across backward() calls until zero_grad().
//
// With pad_token_id set, the embedding lookup gives the pad row no gradient,
// as HF's nn.Embedding(padding_idx) does.
//
// Parameters are addressed by their HF names (params()), in the checkpoint's
// module order; the per-expert and dense gate/up tensors are slices of the
// stacked weights the kernels use. Tensors that share one stacked weight (a
// dense MLP's gate_proj and up_proj; all experts of a layer) are frozen or
// trained together: set_requires_grad on one of them sets the whole group.
//
// Non-finite guard: forward checks the embedding output, each decoder
// layer's attention and MLP outputs (DecoderLayer; one pass each) and the
// loss, and throws an Error at the first NaN/Inf naming it ("model.layers.3.mlp
// output") with a hint. Gradients are the trainer's to check
// (train/grad_clip.h).
#include <memory>
#include <utility>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/progress_meter.h"
#include "tiermoe/core/step_times.h"
#include "tiermoe/dist/comm.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/kernels/quant.h"
#include "tiermoe/model/decoder_layer.h"
#include "tiermoe/model/lm_head.h"
#include "tiermoe/model/token_layout.h"
#include "tiermoe/model/lora.h"
#include "tiermoe/model/weight.h"
#include "tiermoe/moe/aux_loss.h"
#include "tiermoe/remat/policy.h"
#include "tiermoe/tier/device_tier.h"

namespace tiermoe {

struct LossParts {
  double total = 0;  // what forward returns: ce + coef * aux (aux only when it counts)
  double ce = 0;     // mean cross-entropy over the counted targets
  double aux = 0;    // the load-balancing loss (computed whenever the model has MoE layers)
  bool aux_in_total = false;  // output_router_logits
  int64_t targets = 0;        // counted targets
};

// Expert parallelism: a model built over a Comm of P > 1 ranks routes every
// MoE layer's rows to the experts' owners (AllToAllDispatcher); this rank
// holds experts [first_expert(), first_expert() + local_experts()) of each
// layer (E / P of them) and everything that is not a routed expert. params()
// and the checkpoint code see only what this rank holds. The Comm must
// outlive the model.
class CausalLM {
 public:
  // Zero weights (fill them through params(), or use from_checkpoint). The
  // config must be one TierMoE implements (validated here); with a Comm of
  // P ranks, P must divide the expert count.
  // MatrixAlloc::unbound leaves the weight matrices without memory for the
  // loader to bind (from_checkpoint, WeightBinding::mapped).
  CausalLM(ModelConfig config, DType compute, Comm* comm = nullptr,
           MatrixAlloc alloc = MatrixAlloc::zeroed);
  ~CausalLM();
  CausalLM(CausalLM&&) noexcept;
  CausalLM& operator=(CausalLM&&) noexcept;

  // Reads dir/config.json and the checkpoint's tensors (model.safetensors or
  // shards), per-expert or fused expert layout. See checkpoint.h for what is
  // rejected, and for WeightBinding: copy converts every tensor to `compute`;
  // mapped (frozen base weights, LoRA) keeps the weight matrices at their
  // stored width, read in place from the memory-mapped shards.
  // `progress`: a progress line while the tensors load and convert
  // (core/progress_meter.h; silent for loads under a second).
  static CausalLM from_checkpoint(const std::string& dir, DType compute, Comm* comm = nullptr,
                                  WeightBinding binding = WeightBinding::copy,
                                  ProgressSink progress = {});
  // Whether the weight matrices are the checkpoint's bytes (WeightBinding::mapped):
  // then no base parameter can be unfrozen.
  bool weights_bound() const { return bound_; }
  // Of the matrices a checkpoint stores at low width (io/stored_quant.h), how
  // many a mapped load kept so (the routed experts' in f32 and bf16 runs)
  // and how many it dequantized to the compute dtype (the others); a copy
  // load dequantizes them all.
  struct StoredQuantCounts {
    int64_t kept = 0, widened = 0;
  };
  StoredQuantCounts stored_quant_counts() const { return stored_quant_; }
  // Writes config.json and the tensors under HF names in the per-expert
  // layout save_pretrained writes, in `storage` (default: the compute dtype).
  // One rank only (an expert-parallel model's ranks write their parts
  // together: train/checkpoint.h).
  void save_checkpoint(const std::string& dir, std::optional<DType> storage = std::nullopt,
                       uint64_t max_shard_bytes = 5'000'000'000ull) const;
  // The tensors this rank holds under their HF names, in checkpoint order,
  // in `storage` (views when already in it); only routed experts' with
  // experts_only.
  NamedTensors checkpoint_tensors(DType storage, bool experts_only) const;

  const ModelConfig& config() const { return config_; }
  DType dtype() const { return dtype_; }

  // ---- expert parallelism (see the class comment)
  Comm* comm() const { return comm_; }  // null: one rank
  int ep_ranks() const { return dispatcher_->ranks(); }
  int64_t local_experts() const { return config_.num_experts / ep_ranks(); }
  int64_t first_expert() const { return local_experts() * dispatcher_->rank(); }
  // Whether this rank holds expert e (an index among the layer's E).
  bool holds_expert(int64_t e) const {
    return e >= first_expert() && e < first_expert() + local_experts();
  }

  // The loss of B x T tokens. With `grad` the forward keeps what backward()
  // needs; without it, backward() is an Error. The LM head and the loss run
  // in chunks of lm_head_chunk() tokens (lm_head.h): with `grad` the forward
  // already turns each chunk's logits into d loss / d (final hidden state) and
  // accumulates the head's weight gradient (lm_head.weight, or the tied
  // embedding), since no chunk's logits outlive it.
  double forward(std::span<const int32_t> ids_BT, std::span<const int32_t> targets_BT, int64_t B,
                 int64_t T, bool grad = true, const TokenLayout& layout = {});
  // d loss / d every parameter that requires grad, accumulated (+=).
  void backward();
  const LossParts& last_loss() const { return loss_; }
  // [B*T, V] logits of the last forward, computed anew here (the forward
  // keeps only the final hidden state).
  Tensor logits() const;
  // Token rows per LM head chunk (lm_head.h); 0: one chunk of all rows.
  void set_lm_head_chunk(int64_t tokens);
  int64_t lm_head_chunk() const { return head_chunk_; }

  // Every parameter by HF name, in checkpoint order. Gradients of parameters
  // that require grad are allocated (zeroed) here when no backward has yet.
  std::vector<ModelParam> params();
  void zero_grad();
  // Freezes (false) or unfreezes a parameter by HF name, with its group
  // (see above); an unknown name is an Error.
  void set_requires_grad(std::string_view name, bool on);
  void set_requires_grad_all(bool on);

  int64_t num_layers() const { return int64_t(layers_.size()); }
  DecoderLayer& layer(int64_t i) { return *layers_[size_t(i)]; }
  // Every layer's times added up (forward and backward so far).
  LayerTimes layer_times() const;
  // The wall time of every part of forward and backward so far (StepPart);
  // the trainer adds its data and optimizer parts to the same record.
  StepTimes& step_times() { return *step_times_; }

  // ---- remat and score absorption
  // Applies the policy's MoE view (RematPolicy::moe_keep) and the absorption
  // mode to every MoE block, for the following forwards. Loss and gradients
  // are bitwise the same under every policy; absorbed and post-combine agree
  // to rounding. The shared experts (region `shared`) follow the policy as
  // well. The policy's model-level kinds (attention, norm, mlp) are not
  // implemented: the model keeps those activations under every policy.
  void set_moe_options(const RematPolicy& remat, AbsorbScores absorb);
  const RematPolicy& remat_policy() const { return remat_; }
  AbsorbScores absorb_scores() const { return absorb_; }

  // ---- The device tier (tier/device_tier.h)
  // Runs every MoE layer's experts through `tier` (not owned; it must outlive
  // the model's use of it): the i-th MoE layer in model order is the tier's
  // layer i. Results do not change, only where rows are computed.
  void attach_device_tier(DeviceTier& tier);
  DeviceTier* device_tier() { return tier_; }
  const DeviceTier* device_tier() const { return tier_; }
  int64_t num_moe_layers() const;
  // The routed experts' low-width layouts (every MoE layer's are the same),
  // or none when they are held in the compute dtype.
  std::optional<ExpertQuant> expert_quant() const;
  // After an in-place update of the weights (the optimizer step): the
  // trainable experts' packed copies are re-packed before they are next used.
  void expert_weights_changed();
  // Keeps every MoE layer's routed experts at `format` (int4 or int8,
  // `group` columns per scale; kernels/quant.h), quantized from their
  // present weights, which are released, and frozen. Returns the experts'
  // weight bytes before and after.
  std::pair<int64_t, int64_t> quantize_experts(QuantFormat format, int64_t group);

  // ---- LoRA (lora.h)
  // Freezes every base parameter (no base grads are held; experts run a
  // dx-only backward unless adapted) and attaches adapters to the targeted
  // modules: attention q/k/v/o_proj, dense-MLP and shared-expert
  // gate/up/down_proj, and per expert gate/up/down_proj when named; never the
  // router or the shared expert's gate. A ~ U(+-1/sqrt(in)) drawn from
  // Rng(seed) in module order (layers in order; in a layer q, k, v, o, then
  // gate, up, down of the dense MLP or the shared expert, then per expert for
  // MoE layers), B = 0. Once only;
  // Mixtral experts (w1/w2/w3) cannot be targeted; a config matching no
  // module is an Error.
  void enable_lora(const LoraConfig& cfg, uint64_t seed);
  bool has_lora() const { return lora_.has_value(); }
  const LoraConfig& lora_config() const;  // Error when LoRA is not enabled
  // The adapter parameters: name is the PEFT key without "base_model.model."
  // ("model.layers.0.self_attn.q_proj.lora_A.weight"), role the adapted
  // module's, value the master (f32; f64 in f64 runs), grad the same dtype,
  // requires_grad true. Module order as above; lora_A before lora_B.
  std::vector<ModelParam> lora_params();
  // PEFT adapter export: adapter_config.json and adapter_model.safetensors
  // with keys base_model.model.<module>.lora_A/B.weight, tensors in `storage`.
  // With expert parallelism the experts' adapters are gathered from every
  // rank first (a collective: every rank calls it; only one need write).
  void save_lora_adapter(const std::string& dir, DType storage = DType::f32,
                         const std::string& base_model_name_or_path = "") const;
  // Every adapter module of the whole model by module path (views of this
  // rank's, copies of the other ranks' experts'); a collective under expert
  // parallelism when the experts carry adapters.
  PeftLoraModules gather_lora_modules() const;
  // --lora-init DIR: enables LoRA from the adapter's own config when not
  // enabled yet (or checks that it matches the enabled one: rank, alpha,
  // rslora, targets), then loads every A and B. Every adapter module must
  // exist in the model and every model adapter must be in the file, with
  // matching shapes (Errors name the key). Nothing is copied unless all match.
  void load_lora_adapter(const std::string& dir);

 private:
  struct Slot;  // one HF tensor: its views and its group's requires_grad switch
  std::vector<Slot> slots(bool with_grads);
  void fused_moe_slots(std::vector<Slot>& out, const std::string& block, MoeBlock& moe,
                       bool with_grads);
  std::vector<const Routing*> routings() const;
  void check_trainable(std::string_view name) const;  // Error on a bound model
  // WeightBinding::mapped: every weight matrix from the checkpoint (checkpoint.h).
  // embed_source: the stored tensor the embedding reads (lm_head.weight for a
  // tied checkpoint that stores only the head).
  void bind_checkpoint_matrices(const CheckpointTensors& ck, const std::string& embed_source);
  struct LoraModule;  // one adapted module (an expert's projection is one)
  std::vector<LoraModule> lora_modules() const;

  ModelConfig config_;
  DType dtype_;
  Comm* comm_ = nullptr;
  std::unique_ptr<Dispatcher> dispatcher_;
  // Behind a pointer so the layers' pointers to it survive moving the model.
  std::unique_ptr<StepTimes> step_times_ = std::make_unique<StepTimes>();
  Weight embed_;    // (V, D)
  std::vector<std::unique_ptr<DecoderLayer>> layers_;
  Weight norm_;     // (D)
  Weight lm_head_;  // (V, D); undefined value when tied
  RematPolicy remat_;
  AbsorbScores absorb_ = AbsorbScores::automatic;
  std::optional<LoraConfig> lora_;
  DeviceTier* tier_ = nullptr;
  bool bound_ = false;  // WeightBinding::mapped
  StoredQuantCounts stored_quant_;

  // The last forward, kept for backward.
  int64_t B_ = 0, T_ = 0;
  bool has_grad_state_ = false;
  std::vector<int32_t> ids_;
  RopeFrequencies rope_freqs_;  // from the config, once
  RopeTables rope_;
  bool rope_custom_ = false;  // rope_ holds a TokenLayout's positions
  std::vector<DecoderLayerSaved> saved_;
  Tensor xf_TD_, rstd_f_T_, nf_TD_;  // final norm's input, statistics, output
  Tensor dn_TD_;                     // d loss / d nf_TD_, from the chunked head
  int64_t head_chunk_ = kDefaultLmHeadChunk;
  AuxLoss aux_;
  LossParts loss_;
};

// Checks that TierMoE implements what `config` asks for (silu, no sliding
// window, no clip_qkv); throws an Error naming `where` and the field.
void check_model_supported(const ModelConfig& config, const std::string& where);

}  // namespace tiermoe
