// DeepSeek-V3 (DeepseekV3Config, and Kimi-K2's under model_type kimi_k2):
// GLM-4.5's MoE (dense first layers, sigmoid group-limited routing, ungated
// shared experts) under multi-head latent attention, with interleaved rope
// dims and YaRN's mscale on the softmax scale.
#include "config_io.h"

namespace tiermoe::families {

namespace {

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
  io.field("intermediate_size", c.intermediate_size, 18432);
  io.field("moe_intermediate_size", c.moe_intermediate_size, 2048);
  sigmoid_router_fields(
      io, c,
      {.n_routed_experts = 256, .n_group = 8, .topk_group = 4, .routed_scaling_factor = 2.5});
  dense_first_fields(io, c, 3);
  mla_fields(io, c, {.q_lora_rank = 1536, .qk_nope_head_dim = 128, .v_head_dim = 128});
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
      .validate = validate_mla,
  };
  return def;
}

}  // namespace tiermoe::families
