// OLMoE (OlmoeConfig): Qwen3-MoE with RMSNorm over the whole q and k
// projections and an optional clip_qkv; every layer MoE, intermediate_size
// is the expert width, heads split hidden_size evenly (no head_dim field).
#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe::families {

namespace {

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 50304,
                 .hidden_size = 2048,
                 .num_hidden_layers = 16,
                 .num_attention_heads = 16,
                 .num_experts_per_tok = 8,
                 .max_position_embeddings = 4096,
                 .rope_theta = 10000.0,
                 .rms_norm_eps = 1e-5,
                 .router_aux_loss_coef = 0.01,
                 .pad_token_id = 1,
                 .eos_token_id = {50279}});
  io.head_dim(c, HeadDimField::never);
  io.field("intermediate_size", c.moe_intermediate_size, 2048);
  c.intermediate_size = c.moe_intermediate_size;
  io.field("num_experts", c.num_experts, 64);
  io.field("norm_topk_prob", c.norm_topk_prob, false);
  io.field("attention_bias", c.attention_bias, false);
  io.field("clip_qkv", c.clip_qkv);
}

void validate(const ModelConfig& c, const std::string& where) {
  TIERMOE_CHECK(c.head_dim * c.num_attention_heads == c.hidden_size,
                detail::str_of("OLMoE head_dim ", c.head_dim, " times ", c.num_attention_heads,
                               " heads is not hidden_size ", c.hidden_size),
                where, "OLMoE splits hidden_size evenly among the heads");
}

}  // namespace

const FamilyDef& olmoe() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::olmoe,
               .model_type = "olmoe",
               .architecture = "OlmoeForCausalLM",
               .transformers_version = "4.51.0",
               .qk_norm = QkNorm::whole,
               .expert_width_key = "intermediate_size"},
      .fields = fields,
      .validate = validate,
  };
  return def;
}

}  // namespace tiermoe::families
