// The built-in model shapes of `init --preset`, `plan --preset` and the
// benches: small ones for tests and demos, and published configs.
#include <string>
#include <vector>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {

using detail::str_of;

namespace {

// What every DeepSeek-V3 preset shares: the family, its router, interleaved
// rope dims and YaRN with mscale 1 (so the softmax scale grows with the factor).
void deepseek_v3_pieces(ModelConfig& c) {
  c.family = ModelFamily::deepseek_v3;
  c.model_type = "deepseek_v3";
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5;
  c.rope_interleave = true;
  c.rope_scaling = {.kind = RopeScaling::Kind::yarn,
                    .factor = 40.0,
                    .original_max_position_embeddings = 4096,
                    .mscale = 1.0,
                    .mscale_all_dim = 1.0};
  c.rms_norm_eps = 1e-6;
}

// What DeepSeek-V2's releases share beside V3's pieces: the family, its
// softmax router (never renormalised) and YaRN with mscale 0.707 on both
// sides (so the softmax scale grows, the cos/sin do not).
void deepseek_v2_pieces(ModelConfig& c) {
  c.family = ModelFamily::deepseek_v2;
  c.model_type = "deepseek_v2";
  c.norm_topk_prob = false;
  c.rope_scaling.mscale = 0.707;
  c.rope_scaling.mscale_all_dim = 0.707;
  c.num_nextn_predict_layers = 0;
}

}  // namespace

std::vector<std::string> preset_names() {
  return {"tiny",
          "tiny-qwen2-moe",
          "tiny-glm4-moe",
          "tiny-gpt-oss",
          "tiny-deepseek-v3",
          "tiny-glm4-moe-lite",
          "tiny-deepseek-v2",
          "tiny-minimax-m2",
          "tiny-qwen3.5-moe",
          "small",
          "qwen3-30b-a3b",
          "qwen2-57b-a14b",
          "glm-4.5-air",
          "gpt-oss-20b",
          "gpt-oss-120b",
          "deepseek-v3",
          "kimi-k2",
          "glm-4.7-flash",
          "deepseek-v2",
          "deepseek-v2-lite",
          "minimax-m2",
          "qwen3.5-35b-a3b"};
}

ModelConfig preset(std::string_view name, std::optional<int64_t> layers) {
  ModelConfig c;  // Qwen3MoeConfig's defaults, then the preset's shape
  c.norm_topk_prob = true;
  c.tie_word_embeddings = false;
  c.rms_norm_eps = 1e-6;
  if (name == "tiny" || name == "tiny-qwen2-moe" || name == "tiny-glm4-moe" ||
      name == "tiny-gpt-oss" || name == "tiny-deepseek-v3" || name == "tiny-glm4-moe-lite" ||
      name == "tiny-deepseek-v2" || name == "tiny-minimax-m2" || name == "tiny-qwen3.5-moe") {
    c.vocab_size = 256;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.moe_intermediate_size = 32;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.max_position_embeddings = 512;
    if (name == "tiny-qwen2-moe") {  // the same shapes as Qwen2-MoE: q/k/v bias, a shared expert
      c.family = ModelFamily::qwen2_moe;
      c.model_type = "qwen2_moe";
      c.norm_topk_prob = false;
      c.qkv_bias = true;
      c.shared_expert_intermediate_size = 48;
    }
    if (name == "tiny-glm4-moe") {  // GLM-4.5's pieces at tiny's shapes
      c.family = ModelFamily::glm4_moe;
      c.model_type = "glm4_moe";
      c.qkv_bias = true;
      c.use_qk_norm = true;
      c.partial_rotary_factor = 0.5;
      c.first_k_dense_replace = 1;
      c.shared_expert_intermediate_size = c.moe_intermediate_size;  // n_shared_experts 1
      c.n_group = 2;
      c.topk_group = 1;
      c.routed_scaling_factor = 2.5;
      c.rms_norm_eps = 1e-5;
    }
    if (name == "tiny-gpt-oss") {  // gpt-oss's pieces at tiny's shapes, a window of 16
      c.family = ModelFamily::gpt_oss;
      c.model_type = "gpt_oss";
      c.norm_topk_prob = false;
      c.attention_bias = true;
      c.sliding_window = 16;
      c.rope_theta = 150000;
      c.rope_scaling = {.kind = RopeScaling::Kind::yarn,
                        .factor = 4.0,
                        .original_max_position_embeddings = 128,
                        .truncate = false};
      c.rms_norm_eps = 1e-5;
    }
    // DeepSeek-V3's pieces at tiny's shapes, YaRN as its; GLM-4.7-Flash's
    // are the same but for its plain RoPE and scaling factor.
    if (name == "tiny-deepseek-v3" || name == "tiny-glm4-moe-lite" || name == "tiny-deepseek-v2") {
      deepseek_v3_pieces(c);
      c.q_lora_rank = 32;
      c.kv_lora_rank = 16;
      c.qk_nope_head_dim = 16;
      c.qk_rope_head_dim = 8;
      c.v_head_dim = 16;
      c.head_dim = 8;
      c.num_key_value_heads = c.num_attention_heads;
      c.shared_expert_intermediate_size = c.moe_intermediate_size;  // n_shared_experts 1
      c.first_k_dense_replace = 1;
      c.n_group = 2;
      c.topk_group = 1;
      c.rope_scaling.original_max_position_embeddings = 128;
      c.num_nextn_predict_layers = 0;
    }
    if (name == "tiny-glm4-moe-lite") {
      c.family = ModelFamily::glm4_moe_lite;
      c.model_type = "glm4_moe_lite";
      c.rope_scaling = {};
      c.routed_scaling_factor = 1.8;
      c.rms_norm_eps = 1e-5;
    }
    if (name == "tiny-minimax-m2") {  // MiniMax-M2's pieces: every layer MoE, half-head rope
      c.family = ModelFamily::minimax_m2;
      c.model_type = "minimax_m2";
      c.intermediate_size = c.moe_intermediate_size;  // the config's one width
      c.partial_rotary_factor = 0.5;
      c.rope_theta = 5e6;
    }
    if (name == "tiny-qwen3.5-moe") {  // linear and full attention alternating
      c.family = ModelFamily::qwen3_5_moe;
      c.model_type = "qwen3_5_moe_text";
      c.partial_rotary_factor = 0.25;
      c.shared_expert_intermediate_size = 48;
      c.linear_num_key_heads = 2;
      c.linear_num_value_heads = 4;
      c.linear_key_head_dim = 16;
      c.linear_value_head_dim = 16;
      c.linear_conv_kernel_dim = 4;
    }
    if (name == "tiny-deepseek-v2") {  // V2's router over the same shapes, 2 shared experts
      deepseek_v2_pieces(c);
      c.shared_expert_intermediate_size = 2 * c.moe_intermediate_size;
      c.topk_method = "group_limited_greedy";
      c.routed_scaling_factor = 16.0;
    }
  } else if (name == "gpt-oss-20b" || name == "gpt-oss-120b") {
    // openai/gpt-oss-20b's and -120b's config.json as published (their
    // experts there are MXFP4; this preset's checkpoint stores them at the
    // run's dtype): the same but for the depth and the expert count.
    const bool big = name == "gpt-oss-120b";
    c.family = ModelFamily::gpt_oss;
    c.model_type = "gpt_oss";
    c.vocab_size = 201088;
    c.hidden_size = 2880;
    c.intermediate_size = 2880;
    c.moe_intermediate_size = 2880;
    c.num_hidden_layers = big ? 36 : 24;
    c.num_attention_heads = 64;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.num_experts = big ? 128 : 32;
    c.num_experts_per_tok = 4;
    c.norm_topk_prob = false;
    c.attention_bias = true;
    c.sliding_window = 128;
    c.rope_theta = 150000;
    c.rope_scaling = {.kind = RopeScaling::Kind::yarn,
                      .factor = 32.0,
                      .original_max_position_embeddings = 4096,
                      .truncate = false};
    c.rms_norm_eps = 1e-5;
    c.router_aux_loss_coef = 0.9;
    c.max_position_embeddings = 131072;
    c.pad_token_id = 199999;
    c.eos_token_id = {200002};
  } else if (name == "small") {
    c.vocab_size = 4096;
    c.hidden_size = 256;
    c.intermediate_size = 512;
    c.moe_intermediate_size = 128;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = 32;
    c.num_experts = 16;
    c.num_experts_per_tok = 4;
    c.max_position_embeddings = 2048;
  } else if (name == "qwen3-30b-a3b") {
    // Qwen/Qwen3-30B-A3B's config.json as published on the Hugging Face Hub.
    c.vocab_size = 151936;
    c.hidden_size = 2048;
    c.intermediate_size = 6144;
    c.moe_intermediate_size = 768;
    c.num_hidden_layers = 48;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.rope_theta = 1e6;
    c.max_position_embeddings = 40960;
    c.bos_token_id = 151643;
    c.eos_token_id = {151645};
  } else if (name == "qwen2-57b-a14b") {
    // Qwen/Qwen2-57B-A14B's config.json as published on the Hugging Face Hub:
    // 64 routed experts of 2560 and one gated shared expert of 20480 per layer.
    c.family = ModelFamily::qwen2_moe;
    c.model_type = "qwen2_moe";
    c.norm_topk_prob = false;
    c.qkv_bias = true;
    c.vocab_size = 151936;
    c.hidden_size = 3584;
    c.intermediate_size = 18944;
    c.moe_intermediate_size = 2560;
    c.shared_expert_intermediate_size = 20480;
    c.num_hidden_layers = 28;
    c.num_attention_heads = 28;
    c.num_key_value_heads = 4;
    c.head_dim = 128;
    c.num_experts = 64;
    c.num_experts_per_tok = 8;
    c.rope_theta = 1e6;
    c.max_position_embeddings = 131072;
    c.sliding_window = 131072;  // unused: use_sliding_window is false
    c.bos_token_id = 151643;
    c.eos_token_id = {151643};
  } else if (name == "glm-4.5-air") {
    // zai-org/GLM-4.5-Air's config.json as published on the Hugging Face Hub:
    // layer 0 dense, 128 routed experts of 1408 and one shared one per layer,
    // q/k/v bias, half-rotary RoPE; its multi-token-prediction layer (46) is
    // skipped on load.
    c.family = ModelFamily::glm4_moe;
    c.model_type = "glm4_moe";
    c.vocab_size = 151552;
    c.hidden_size = 4096;
    c.intermediate_size = 10944;
    c.moe_intermediate_size = 1408;
    c.shared_expert_intermediate_size = 1408;
    c.num_hidden_layers = 46;
    c.num_attention_heads = 96;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.num_experts = 128;
    c.num_experts_per_tok = 8;
    c.first_k_dense_replace = 1;
    c.n_group = 1;
    c.topk_group = 1;
    c.routed_scaling_factor = 1.0;
    c.norm_topk_prob = true;
    c.qkv_bias = true;
    c.partial_rotary_factor = 0.5;
    c.num_nextn_predict_layers = 1;
    c.rope_theta = 1e6;
    c.rms_norm_eps = 1e-5;
    c.max_position_embeddings = 131072;
    c.pad_token_id = 151329;
    c.eos_token_id = {151329, 151336, 151338};
  } else if (name == "deepseek-v3" || name == "kimi-k2") {
    // deepseek-ai/DeepSeek-V3's and moonshotai/Kimi-K2-Instruct's config.json
    // as published on the Hugging Face Hub (both ship their weights in block
    // FP8; this preset's checkpoint stores them at the run's dtype). Kimi-K2
    // is DeepSeek-V3's architecture with half the heads, 384 experts in one
    // group, one dense layer and its own RoPE; its MTP layer is not shipped.
    const bool kimi = name == "kimi-k2";
    deepseek_v3_pieces(c);
    c.vocab_size = kimi ? 163840 : 129280;
    c.hidden_size = 7168;
    c.intermediate_size = 18432;
    c.moe_intermediate_size = 2048;
    c.shared_expert_intermediate_size = 2048;
    c.num_hidden_layers = 61;
    c.num_attention_heads = kimi ? 64 : 128;
    c.num_key_value_heads = c.num_attention_heads;
    c.q_lora_rank = 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.head_dim = 64;
    c.num_experts = kimi ? 384 : 256;
    c.num_experts_per_tok = 8;
    c.n_group = kimi ? 1 : 8;
    c.topk_group = kimi ? 1 : 4;
    c.first_k_dense_replace = kimi ? 1 : 3;
    c.routed_scaling_factor = kimi ? 2.827 : 2.5;
    c.num_nextn_predict_layers = kimi ? 0 : 1;
    c.rope_theta = kimi ? 50000 : 10000;
    c.rope_scaling.factor = kimi ? 32 : 40;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.beta_fast = kimi ? 1 : 32;
    c.max_position_embeddings = kimi ? 131072 : 163840;
    c.bos_token_id = kimi ? 163584 : 0;
    c.eos_token_id = {kimi ? 163585 : 1};
  } else if (name == "glm-4.7-flash") {
    // Glm4MoeLiteConfig's defaults in transformers 5.25 are GLM-4.7-Flash's
    // shapes: DeepSeek-V3's attention (20 heads, q latent 768, kv latent
    // 512, q/k 192 + 64, v 256) and GLM-4.5's MoE (64 routed experts of
    // 1536, 4 per token, one shared), layer 0 dense. So the preset is a
    // config.json naming only its model_type, stored in bf16.
    c = parse_model_config(R"({"model_type": "glm4_moe_lite", "torch_dtype": "bfloat16"})",
                           "preset glm-4.7-flash");
  } else if (name == "deepseek-v2" || name == "deepseek-v2-lite") {
    // deepseek-ai/DeepSeek-V2's and DeepSeek-V2-Lite's config.json as
    // published: V2 routes 6 of 160 experts within the 3 best of 8 groups
    // and compresses q through a latent; Lite routes 6 of 64 greedily and
    // takes q straight from the hidden state.
    const bool lite = name == "deepseek-v2-lite";
    deepseek_v3_pieces(c);
    deepseek_v2_pieces(c);
    c.vocab_size = 102400;
    c.hidden_size = lite ? 2048 : 5120;
    c.intermediate_size = lite ? 10944 : 12288;
    c.moe_intermediate_size = lite ? 1408 : 1536;
    c.shared_expert_intermediate_size = 2 * c.moe_intermediate_size;
    c.num_hidden_layers = lite ? 27 : 60;
    c.num_attention_heads = lite ? 16 : 128;
    c.num_key_value_heads = c.num_attention_heads;
    c.q_lora_rank = lite ? 0 : 1536;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.head_dim = 64;
    c.num_experts = lite ? 64 : 160;
    c.num_experts_per_tok = 6;
    c.topk_method = lite ? "greedy" : "group_limited_greedy";
    c.n_group = lite ? 1 : 8;
    c.topk_group = lite ? 1 : 3;
    c.routed_scaling_factor = lite ? 1.0 : 16.0;
    c.first_k_dense_replace = 1;
    c.max_position_embeddings = 163840;
    c.bos_token_id = 100000;
    c.eos_token_id = {100001};
  } else if (name == "minimax-m2") {
    // MiniMaxM2Config's defaults in transformers 5.25 are MiniMax-M2's
    // shapes (62 layers of 256 experts of 1536, 8 per token; 48 heads of
    // 128, 8 kv heads); its released config.json adds rotary_dim 64, the
    // rope on half of each head.
    c = parse_model_config(
        R"({"model_type": "minimax_m2", "rotary_dim": 64, "torch_dtype": "bfloat16"})",
        "preset minimax-m2");
  } else if (name == "qwen3.5-35b-a3b") {
    // Qwen3_5MoeTextConfig's defaults in transformers 5.25 are
    // Qwen3.5-35B-A3B's shapes (40 layers, three Gated DeltaNet layers to one
    // gated attention layer; 256 experts of 512, 8 per token, a shared expert
    // of 512); its released config adds rope_theta 10^7 and 262,144 positions.
    c = parse_model_config(R"({"model_type": "qwen3_5_moe_text", "torch_dtype": "bfloat16",
                               "max_position_embeddings": 262144,
                               "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                                   "partial_rotary_factor": 0.25}})",
                           "preset qwen3.5-35b-a3b");
  } else {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error(str_of("unknown preset '", name, "'"), "--preset", "use one of " + names);
  }
  if (layers) {
    check_in_range(*layers, 1, ModelConfig::kMaxLayers, "--layers",
                   "the model needs at least one decoder layer, and published models have at "
                   "most a few hundred");
    c.num_hidden_layers = *layers;
  }
  c.max_window_layers = c.num_hidden_layers;
  if (c.family == ModelFamily::gpt_oss) {  // transformers' alternation: sliding on even layers
    c.layer_types.clear();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      c.layer_types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
    }
  }
  if (c.family == ModelFamily::qwen3_5_moe) {
    // full_attention_interval's rule, every 4th layer full (tiny: every 2nd),
    // and the last layer full as at the published depth, so that a cut
    // (--layers 2) runs both kinds.
    const int64_t interval = name == "tiny-qwen3.5-moe" ? 2 : 4;
    c.layer_types.clear();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const bool full = (l + 1) % interval == 0 || l + 1 == c.num_hidden_layers;
      c.layer_types.push_back(full ? "full_attention" : "linear_attention");
    }
  }
  c.validate(str_of("preset ", name));
  return c;
}

}  // namespace tiermoe
