#pragma once
// A Hugging Face MoE config.json as one struct. Field names and defaults are
// those of transformers' Qwen3MoeConfig; Mixtral, OLMoE, Qwen2-MoE, GLM-4.5,
// gpt-oss and DeepSeek-V3 configs map onto the same fields (their expert width lands in
// moe_intermediate_size), and `family` names the spec (io/family.h) that
// says what the model computes differently and how the checkpoint names it.
//
// Parsing is strict where transformers is silent: a wrong JSON type, a size
// that is not positive, heads that do not divide, or a feature TierMoE does
// not implement (another activation, RoPE scaling other than YaRN) is an Error naming the
// file and the field, never a silently different model.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/dtype.h"
#include "tiermoe/io/family.h"

namespace tiermoe {

// config.json's torch_dtype for a TierMoE dtype: "float64", "float32", "bfloat16".
std::string_view torch_dtype_name(DType dtype);

// RoPE scaling (config.json's rope_scaling, or transformers 5's
// rope_parameters): none, or YaRN with transformers' fields and defaults
// (model/rope_frequencies.h computes the frequencies and the cos/sin scale).
struct RopeScaling {
  enum class Kind : uint8_t { none, yarn } kind = Kind::none;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: max_position_embeddings
  double beta_fast = 32, beta_slow = 1;
  bool truncate = true;
  std::optional<double> attention_factor, mscale, mscale_all_dim;

  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  // Bounds on what a config may claim, far above any published model (the
  // deepest MoE configs have under 100 layers, the widest 384 experts per
  // layer) and low enough that the per-layer and per-expert lists built from
  // a config (tensor names, routing profiles) stay a few hundred MB at most.
  static constexpr int64_t kMaxLayers = int64_t(1) << 14;
  static constexpr int64_t kMaxExperts = int64_t(1) << 14;
  static constexpr int64_t kMaxExpertTensors = int64_t(1) << 18;  // MoE layers x experts
  static constexpr int64_t kMaxVocab = int64_t(1) << 31;          // token ids are int32

  ModelFamily family = ModelFamily::qwen3_moe;
  std::string model_type = "qwen3_moe";

  int64_t vocab_size = 151936;                // V
  int64_t hidden_size = 2048;                 // D
  int64_t intermediate_size = 6144;           // dense MLP width (non-MoE layers)
  int64_t moe_intermediate_size = 768;        // F, one expert's width
  int64_t num_hidden_layers = 24;
  int64_t num_attention_heads = 32;           // H
  int64_t num_key_value_heads = 4;            // Hkv
  int64_t head_dim = 64;                      // P; config.json may omit it (then D / H)
  int64_t num_experts = 128;                  // E
  int64_t num_experts_per_tok = 8;            // K
  bool norm_topk_prob = false;                // renormalise the K weights (Mixtral: always)
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  double router_aux_loss_coef = 0.001;
  bool output_router_logits = false;          // HF adds the aux loss only when true
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 32768;
  bool attention_bias = false;  // a bias on q, k, v and o_proj
  bool qkv_bias = false;        // Qwen2-MoE: a bias on q, k and v_proj only
  // One dense SwiGLU MLP of this width beside the routed experts of every
  // MoE layer (0: none): Qwen2-MoE's shared_expert, scaled by
  // sigmoid(shared_expert_gate(x)); GLM-4.5's shared_experts, n_shared_experts
  // * moe_intermediate_size wide, ungated.
  int64_t shared_expert_intermediate_size = 0;
  // GLM-4.5 (DeepSeek-V3's MoE): the first layers are dense, the router is
  // sigmoid with group-limited selection on e_score_correction_bias, RoPE
  // turns only the first head_dim * partial_rotary_factor values of a head,
  // and the checkpoint's multi-token-prediction layers (model.layers.L ..
  // L + num_nextn_predict_layers - 1) are skipped on load, as transformers does.
  int64_t first_k_dense_replace = 0;
  int64_t n_group = 1, topk_group = 1;  // DeepSeek-V2: 0 for config.json's null
  double routed_scaling_factor = 1.0;
  // DeepSeek-V2: "greedy" (the top K of all experts) or "group_limited_greedy"
  // (of the topk_group groups with the best single score); empty elsewhere.
  std::string topk_method;
  bool use_qk_norm = false;
  double partial_rotary_factor = 1.0;
  int64_t num_nextn_predict_layers = 0;
  std::string hidden_act = "silu";
  double initializer_range = 0.02;
  std::string torch_dtype = "bfloat16";       // the checkpoint's dtype as HF names it
  double attention_dropout = 0.0;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_id;          // none, one id, or several (HF accepts a list)
  std::optional<int64_t> pad_token_id;        // its embedding row is zeroed at init, as HF does
  bool use_sliding_window = false;
  std::optional<int64_t> sliding_window;
  int64_t max_window_layers = 28;
  std::optional<double> clip_qkv;             // OLMoE: clamp q, k, v to [-c, c]
  // gpt-oss: each layer's attention, "sliding_attention" (a window of
  // sliding_window keys) or "full_attention"; a learned sink per head; the
  // clamped SwiGLU experts (moe/experts.h: gpt_oss) with biases, their
  // checkpoint tensors fused and x-major; a biased router.
  std::vector<std::string> layer_types;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
  // quantization_config.quant_method: how the checkpoint ships its low-bit
  // matrices: empty (none), "mxfp4" (gpt-oss's experts, io/mxfp4.h), "fp8"
  // (block FP8) or "compressed-tensors" (int4/int8, io/stored_quant.h), the
  // latter's weights at quant_bits with quant_group columns per scale (0:
  // one per row). Never written back: TierMoE saves what it holds, at its
  // compute width.
  std::string quant_method;
  int quant_bits = 0;
  int64_t quant_group = 0;
  // DeepSeek-V3 (Kimi-K2): multi-head latent attention (model/mla_attention.h).
  // q comes from a q_lora_rank latent (0: config.json's null, q_proj straight
  // from the hidden state), k and v from a kv_lora_rank latent and one shared
  // rope key per token; a q/k head is qk_nope_head_dim + qk_rope_head_dim
  // wide, a v head v_head_dim. head_dim is qk_rope_head_dim, the width RoPE
  // turns, as transformers sets it. rope_interleave: the rope dims come in
  // adjacent pairs (x0, x1), (x2, x3), ...
  int64_t q_lora_rank = 0, kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = false;
  // Qwen3.5-MoE: layer_types' "linear_attention" layers run Gated DeltaNet
  // (model/gated_deltanet.h) with these key and value heads and a causal
  // conv of linear_conv_kernel_dim taps; its "full_attention" layers GQA.
  int64_t linear_num_key_heads = 0, linear_key_head_dim = 0;
  int64_t linear_num_value_heads = 0, linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;

  bool operator==(const ModelConfig&) const = default;

  const FamilySpec& spec() const { return family_spec(family); }
  bool is_moe_layer(int64_t layer) const;     // decoder_sparse_step, mlp_only_layers
  QkNorm qk_norm() const {
    return spec().qk_norm_switched && !use_qk_norm ? QkNorm::none : spec().qk_norm;
  }
  bool renormalize_topk() const { return spec().always_renormalize || norm_topk_prob; }
  bool q_k_v_bias() const { return attention_bias || qkv_bias; }
  bool has_shared_expert() const { return shared_expert_intermediate_size > 0; }
  bool shared_expert_gated() const { return spec().shared_expert_gated; }
  bool sigmoid_router() const { return spec().sigmoid_router(); }
  bool mla() const { return spec().attention == AttentionKind::mla; }
  // Whether decoder layer `layer` runs Gated DeltaNet (layer_types' "linear_attention").
  bool linear_attention(int64_t layer) const;
  // Gated DeltaNet's widths: q's and k's, v's, and the conv's (q, k, v).
  int64_t linear_key_width() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_width() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t linear_conv_width() const { return 2 * linear_key_width() + linear_value_width(); }
  // Its attention module's name: "linear_attn" there, "self_attn" elsewhere.
  std::string_view attention_module(int64_t layer) const {
    return linear_attention(layer) ? "linear_attn" : "self_attn";
  }
  // A query (and key) head's width, and a value head's: head_dim for GQA.
  int64_t qk_head_dim() const { return mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
  int64_t v_dim() const { return mla() ? v_head_dim : head_dim; }
  // The keys a query of `layer` sees back to (kernels/attention.h: window); 0: all.
  int64_t attention_window(int64_t layer) const;
  // The head dims RoPE turns, as transformers computes it: int(P * factor).
  int64_t rotary_dim() const { return int64_t(double(head_dim) * partial_rotary_factor); }
  int64_t num_moe_layers() const;

  // A config.json that transformers loads as-is (AutoConfig and the family's
  // *ForCausalLM), with this family's field names. Pretty-printed, sorted keys.
  std::string to_json() const;
  // Checks every invariant parse_model_config checks; `where` names the source.
  void validate(const std::string& where) const;
  // Sets vocab_size to V (a preset's shapes with a cut-down embedding): the
  // special token ids V cannot hold (bos, eos, pad at or past V) are dropped,
  // as a config without them says, and named in the result ("bos_token_id
  // 151643", ...), so the caller can say so.
  std::vector<std::string> set_vocab_size(int64_t V);
};

// Parses config.json text; `path` is only used in error messages.
ModelConfig parse_model_config(std::string_view json_text, const std::string& path);
// Reads and parses a config.json file, or `dir/config.json` when given a directory.
ModelConfig load_model_config(const std::string& path);
// Writes to_json() to `path` (atomically: temporary file, then rename).
void save_model_config(const ModelConfig& config, const std::string& path);

// Built-in shapes (model_presets.cpp): "tiny", "tiny-qwen2-moe",
// "tiny-glm4-moe", "tiny-gpt-oss" and "tiny-deepseek-v3" (tests, demo),
// "small", and the published configs "qwen3-30b-a3b", "qwen2-57b-a14b",
// "glm-4.5-air", "gpt-oss-20b", "gpt-oss-120b", "deepseek-v3" and "kimi-k2".
// `layers` overrides num_hidden_layers.
ModelConfig preset(std::string_view name, std::optional<int64_t> layers = std::nullopt);
std::vector<std::string> preset_names();

// Parameter counts from the config alone.
struct ParamCounts {
  int64_t total = 0;
  int64_t per_expert = 0;        // 3 * D * F (gate, up, down)
  int64_t active_per_token = 0;  // total minus the (E - K) unselected experts of every MoE layer
                                 // (a shared expert is always active)
  int64_t embedding = 0;         // V * D (the input embedding alone)
  int64_t experts = 0;           // every expert of every MoE layer
};
// Every product overflow-checked: an Error at `where` when a count does not
// fit int64 (validate() runs it, so a validated config always counts).
ParamCounts param_counts(const ModelConfig& config, const std::string& where = "config.json");

}  // namespace tiermoe
