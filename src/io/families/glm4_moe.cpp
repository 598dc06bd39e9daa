// GLM-4.5 (Glm4MoeConfig): DeepSeek-V3's MoE (dense first layers, sigmoid
// group-limited routing, ungated shared experts) under grouped-query
// attention with a q/k/v bias (its attention_bias: o_proj has none), an
// optional per-head q/k norm and RoPE on part of each head.
#include "config_io.h"

namespace tiermoe::families {

namespace {

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 151552,
                 .hidden_size = 4096,
                 .num_hidden_layers = 46,
                 .num_attention_heads = 96,
                 .num_key_value_heads = 8,
                 .num_experts_per_tok = 8,
                 .max_position_embeddings = 131072,
                 .rope_theta = 10000.0,
                 .rms_norm_eps = 1e-5});
  io.head_dim(c, HeadDimField::always);
  io.field("intermediate_size", c.intermediate_size, 10944);
  io.field("moe_intermediate_size", c.moe_intermediate_size, 1408);
  sigmoid_router_fields(
      io, c,
      {.n_routed_experts = 128, .n_group = 1, .topk_group = 1, .routed_scaling_factor = 1.0});
  dense_first_fields(io, c, 1);
  io.field("use_qk_norm", c.use_qk_norm, false);
  io.field("attention_bias", c.qkv_bias, false);
  io.rope_field("partial_rotary_factor", c.partial_rotary_factor, 0.5);
}

}  // namespace

const FamilyDef& glm4_moe() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::glm4_moe,
               .model_type = "glm4_moe",
               .architecture = "Glm4MoeForCausalLM",
               .transformers_version = "4.51.0",
               .qk_norm = QkNorm::per_head,
               .qk_norm_switched = true,
               .router = RouterRule::sigmoid_grouped,
               .experts_key = "n_routed_experts"},
      .fields = fields,
  };
  return def;
}

}  // namespace tiermoe::families
