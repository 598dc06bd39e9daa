// Mixtral (MixtralConfig): Qwen3-MoE without the q/k norm; every layer MoE,
// intermediate_size is the expert width, the top-K weights always
// renormalised; the experts are w1 (gate), w3 (up) and w2 (down) under
// block_sparse_moe, its router renamed mlp.gate by transformers 5.
#include "config_io.h"

namespace tiermoe::families {

namespace {

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 32000,
                 .hidden_size = 4096,
                 .num_hidden_layers = 32,
                 .num_attention_heads = 32,
                 .num_key_value_heads = 8,
                 .num_experts_per_tok = 2,
                 .max_position_embeddings = 4096 * 32,
                 .rope_theta = 1e6,
                 .rms_norm_eps = 1e-5,
                 .bos_token_id = 1,
                 .eos_token_id = {2}});
  io.head_dim(c, HeadDimField::always);
  io.field("intermediate_size", c.moe_intermediate_size, 14336);
  c.intermediate_size = c.moe_intermediate_size;
  io.field("num_local_experts", c.num_experts, 8);
  io.fixed("sliding_window", nullptr,
           "TierMoE implements full causal attention only; set sliding_window to null");
  io.fixed("router_jitter_noise", 0.0, "TierMoE routes without jitter; set it to 0.0");
}

}  // namespace

const FamilyDef& mixtral() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::mixtral,
               .model_type = "mixtral",
               .architecture = "MixtralForCausalLM",
               .transformers_version = "4.51.0",
               .always_renormalize = true,
               .expert_lora = false,
               .moe_block = "block_sparse_moe",
               .expert_projections = {"w1", "w3", "w2"},
               .router_renamed_in_v5 = true,
               .experts_key = "num_local_experts",
               .expert_width_key = "intermediate_size"},
      .fields = fields,
  };
  return def;
}

}  // namespace tiermoe::families
