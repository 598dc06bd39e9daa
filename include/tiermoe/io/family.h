#pragma once
// What a model family is, in one place: the features the model reads and the
// names its checkpoint holds. Each family's spec is one file under
// src/io/families/, beside its config.json field table (the way transformers'
// modular_*.py files say only what differs); a new family is that file, its
// presets and at most one attention kind.
#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace tiermoe {

enum class ModelFamily : uint8_t {
  qwen3_moe,
  mixtral,
  olmoe,
  qwen2_moe,
  glm4_moe,
  gpt_oss,
  deepseek_v3,    // and Kimi-K2 (model_type kimi_k2: the same architecture)
  glm4_moe_lite,  // GLM-4.7-Flash
  deepseek_v2,
  minimax_m2,
  qwen3_5_moe,  // Qwen3.5-MoE's text model: Gated DeltaNet and gated attention layers
};

// How attention normalises q and k before RoPE.
enum class QkNorm : uint8_t {
  none,      // Mixtral
  per_head,  // Qwen3: RMSNorm over each head's P values, weight [P]
  whole,     // OLMoE: RMSNorm over the whole projection, weights [Hq*P] and [Hkv*P]
};

enum class AttentionKind : uint8_t {
  gqa,  // grouped-query attention (model/attention_block.h)
  mla,  // multi-head latent attention (model/mla_attention.h)
  // gqa on the config's "full_attention" layers, Gated DeltaNet's linear
  // attention (model/gated_deltanet.h) on its "linear_attention" ones (Qwen3.5)
  hybrid_linear,
};

enum class RouterRule : uint8_t {
  softmax_topk,     // softmax over the E logits, top K (renormalised when asked)
  sigmoid_grouped,  // DeepSeek-V3's: sigmoid, e_score_correction_bias, group-limited, scaled
  softmax_grouped,  // DeepSeek-V2's: softmax, greedy or group-limited by each group's best, scaled
  topk_softmax,     // gpt-oss's: a biased router's top K logits, softmaxed over those K
};

// How a MoE layer's experts are stored in the checkpoint.
enum class ExpertLayout : uint8_t {
  // One tensor per expert and projection, [F, D] / [D, F] (save_pretrained's
  // names); transformers 5's fused gate_up_proj [E, 2F, D] and down_proj
  // [E, D, F] are read as well (io/hf_names.h: hf_checkpoint_tensors).
  per_expert,
  // gpt-oss's: fused and x-major, gate_up_proj [E, D, 2F] with gate and up
  // interleaved, down_proj [E, F, D], each with a bias; shipped in MXFP4.
  fused_x_major,
};

struct FamilySpec {
  ModelFamily family;
  std::string_view model_type;            // config.json's, as TierMoE writes it
  std::vector<std::string_view> aliases;  // other model_types of the same architecture
  std::string_view architecture;          // "Qwen3MoeForCausalLM"
  std::string_view transformers_version;  // the first release with every field written
  // The model_type of the family's multimodal releases, read as their text
  // model: its config under text_config, its weights under
  // model.language_model. (Qwen3.5's qwen3_5_moe); empty for none.
  std::string_view multimodal_model_type;

  // What the model computes.
  AttentionKind attention = AttentionKind::gqa;
  QkNorm qk_norm = QkNorm::none;
  bool qk_norm_switched = false;        // only when config.json's use_qk_norm says so (GLM-4.5)
  bool attention_sinks = false;         // a learned sink logit per head (gpt-oss)
  bool norm_cast_after_weight = false;  // RMSNorm rounds after the weight (gpt-oss)
  // Every RMSNorm scales by 1 + w, its weight stored zero-centred (Qwen3.5),
  // but Gated DeltaNet's gated norm.
  bool zero_centred_norms = false;
  // q_proj gives each head P gate values after its P query values, and
  // attention's output is scaled by their sigmoid before o_proj (Qwen3.5).
  bool attention_output_gate = false;
  RouterRule router = RouterRule::softmax_topk;
  bool always_renormalize = false;   // the top-K weights, whatever norm_topk_prob says (Mixtral)
  bool clamped_experts = false;      // swiglu_alpha/limit's clamped GLU with biases (gpt-oss)
  bool shared_expert_gated = false;  // sigmoid(shared_expert_gate(x)) scales it (Qwen2-MoE)
  // LoRA on the routed experts, exported under gate_proj/up_proj/down_proj
  // (not under Mixtral's w1/w3/w2 yet).
  bool expert_lora = true;

  // What its checkpoint and adapters are named.
  std::string_view moe_block = "mlp";  // Mixtral: "block_sparse_moe"
  std::string_view router_name = "gate";
  std::array<std::string_view, 3> expert_projections = {"gate_proj", "up_proj", "down_proj"};
  std::string_view shared_expert = "shared_experts";  // Qwen2-MoE: "shared_expert"
  // The sigmoid router's e_score_correction_bias under the MoE block itself
  // (MiniMax-M2), not under its router.
  bool selection_bias_on_block = false;
  ExpertLayout expert_layout = ExpertLayout::per_expert;
  // transformers 5 renames "<moe_block>.gate" to "mlp.gate" (Mixtral).
  bool router_renamed_in_v5 = false;
  // config.json's names for the expert count and one expert's width (messages).
  std::string_view experts_key = "num_experts";
  std::string_view expert_width_key = "moe_intermediate_size";
  // The low-width format its releases ship experts in: what `init --experts` writes.
  std::string_view shipped_experts = "int4";

  bool sigmoid_router() const { return router == RouterRule::sigmoid_grouped; }
};

const FamilySpec& family_spec(ModelFamily family);
// The HF model_type TierMoE writes for the family.
std::string_view family_name(ModelFamily family);
// Every family, in ModelFamily order.
std::vector<ModelFamily> all_families();
// "qwen3_moe, mixtral, ..., deepseek_v3 (kimi_k2)": for messages.
std::string supported_model_types();

}  // namespace tiermoe
