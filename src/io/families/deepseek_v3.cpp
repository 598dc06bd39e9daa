// DeepSeek-V3 (DeepseekV3Config, and Kimi-K2's under model_type kimi_k2):
// GLM-4.5's MoE (dense first layers, sigmoid group-limited routing, ungated
// shared experts) under multi-head latent attention, with interleaved rope
// dims and YaRN's mscale on the softmax scale.
#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe::families {

namespace {

using detail::str_of;

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 129280,
                 .hidden_size = 7168,
                 .num_hidden_layers = 61,
                 .num_attention_heads = 128,
                 .num_key_value_heads = 128,
                 .num_experts_per_tok = 8,
                 .max_position_embeddings = 4096,
                 .rope_theta = 10000.0,
                 .rms_norm_eps = 1e-6,
                 .bos_token_id = 0,
                 .eos_token_id = {1}});
  // MLA expands k and v for every head; DeepseekV3Attention never reads the field.
  c.num_key_value_heads = c.num_attention_heads;
  io.field("intermediate_size", c.intermediate_size, 18432);
  io.field("moe_intermediate_size", c.moe_intermediate_size, 2048);
  sigmoid_router_fields(io, c,
                        {.n_routed_experts = 256,
                         .n_group = 8,
                         .topk_group = 4,
                         .first_k_dense_replace = 3,
                         .routed_scaling_factor = 2.5});
  io.field("attention_bias", c.attention_bias, false);
  // q_lora_rank null: q_proj straight from the hidden state (0 here).
  std::optional<int64_t> q_rank = c.q_lora_rank > 0 ? std::optional(c.q_lora_rank) : std::nullopt;
  io.field("q_lora_rank", q_rank, 1536);
  c.q_lora_rank = q_rank.value_or(0);
  io.field("kv_lora_rank", c.kv_lora_rank, 512);
  io.field("qk_nope_head_dim", c.qk_nope_head_dim, 128);
  io.field("qk_rope_head_dim", c.qk_rope_head_dim, 64);
  io.field("v_head_dim", c.v_head_dim, 128);
  c.head_dim = c.qk_rope_head_dim;  // as DeepseekV3Config sets it, whatever config.json says
  io.field("rope_interleave", c.rope_interleave, true);
  // Fields DeepSeek's own configuration code reads (transformers ignores them).
  const char* routing =
      "DeepSeek-V3's architecture routes with topk_method \"noaux_tc\" and "
      "scoring_func \"sigmoid\"";
  io.fixed("topk_method", "noaux_tc", routing);
  io.fixed("scoring_func", "sigmoid", routing);
  io.fixed("moe_layer_freq", 1,
           "DeepSeek-V3's architecture makes every layer from first_k_dense_replace on MoE: "
           "set moe_layer_freq to 1");
}

void validate(const ModelConfig& c, const std::string& where) {
  auto positive = [&](const char* field, int64_t v) {
    TIERMOE_CHECK(v > 0, str_of("config field '", field, "' must be positive, got ", v), where,
                  "fix the value in config.json");
  };
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("qk_nope_head_dim", c.qk_nope_head_dim);
  positive("qk_rope_head_dim", c.qk_rope_head_dim);
  positive("v_head_dim", c.v_head_dim);
  TIERMOE_CHECK(c.q_lora_rank >= 0, str_of("config field 'q_lora_rank' is ", c.q_lora_rank), where,
                "a positive rank, or null for q_proj straight from the hidden state");
  TIERMOE_CHECK(c.head_dim == c.qk_rope_head_dim,
                str_of("head_dim ", c.head_dim, " is not qk_rope_head_dim ", c.qk_rope_head_dim),
                where, "under MLA head_dim is the rope width (transformers sets it so)");
  TIERMOE_CHECK(c.num_key_value_heads == c.num_attention_heads,
                str_of("num_key_value_heads ", c.num_key_value_heads, " with ",
                       c.num_attention_heads, " heads"),
                where,
                "multi-head latent attention expands k and v for every head: set "
                "num_key_value_heads to num_attention_heads (or null)");
}

}  // namespace

const FamilyDef& deepseek_v3() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::deepseek_v3,
               .model_type = "deepseek_v3",
               .aliases = {"kimi_k2"},  // Kimi-K2 ships the architecture under its own name
               .architecture = "DeepseekV3ForCausalLM",
               .transformers_version = "4.51.0",
               .attention = AttentionKind::mla,
               .router = RouterRule::sigmoid_grouped,
               .experts_key = "n_routed_experts"},
      .fields = fields,
      .validate = validate,
  };
  return def;
}

}  // namespace tiermoe::families
