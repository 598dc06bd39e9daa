// Qwen3-MoE (Qwen3MoeConfig): the reference family. Grouped-query attention
// with a per-head q/k RMSNorm, softmax top-k routing, SwiGLU experts, every
// layer MoE unless decoder_sparse_step or mlp_only_layers say otherwise.
#include "config_io.h"

namespace tiermoe::families {

namespace {

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 151936,
                 .hidden_size = 2048,
                 .num_hidden_layers = 24,
                 .num_attention_heads = 32,
                 .num_key_value_heads = 4,
                 .num_experts_per_tok = 8,
                 .max_position_embeddings = 32768,
                 .rope_theta = 10000.0,
                 .rms_norm_eps = 1e-6});
  io.head_dim(c, HeadDimField::always);
  io.field("intermediate_size", c.intermediate_size, 6144);
  io.field("moe_intermediate_size", c.moe_intermediate_size, 768);
  io.aliased("num_experts", "num_local_experts", c.num_experts, 128);
  io.field("norm_topk_prob", c.norm_topk_prob, false);
  io.field("decoder_sparse_step", c.decoder_sparse_step, 1);
  io.field("mlp_only_layers", c.mlp_only_layers);
  io.field("attention_bias", c.attention_bias, false);
  io.field("use_sliding_window", c.use_sliding_window, false);
  io.field("sliding_window", c.sliding_window, std::nullopt);
  io.field("max_window_layers", c.max_window_layers, 28);
}

}  // namespace

const FamilyDef& qwen3_moe() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::qwen3_moe,
               .model_type = "qwen3_moe",
               .architecture = "Qwen3MoeForCausalLM",
               .transformers_version = "4.51.0",
               .qk_norm = QkNorm::per_head},
      .fields = fields,
  };
  return def;
}

}  // namespace tiermoe::families
