// Qwen2-MoE (Qwen2MoeConfig): Qwen3-MoE without the q/k norm, with a bias
// on q, k and v_proj (qkv_bias) and a shared expert in every MoE layer,
// scaled by sigmoid(shared_expert_gate(x)).
#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe::families {

namespace {

using detail::str_of;

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 151936,
                 .hidden_size = 2048,
                 .num_hidden_layers = 24,
                 .num_attention_heads = 16,
                 .num_key_value_heads = 16,
                 .num_experts_per_tok = 4,
                 .max_position_embeddings = 32768,
                 .rope_theta = 10000.0,
                 .rms_norm_eps = 1e-6});
  io.head_dim(c, HeadDimField::when_uneven);  // its attention reads one when present
  io.field("intermediate_size", c.intermediate_size, 5632);
  io.field("moe_intermediate_size", c.moe_intermediate_size, 1408);
  io.field("shared_expert_intermediate_size", c.shared_expert_intermediate_size, 5632);
  io.field("num_experts", c.num_experts, 60);
  io.field("norm_topk_prob", c.norm_topk_prob, false);
  io.field("decoder_sparse_step", c.decoder_sparse_step, 1);
  io.field("mlp_only_layers", c.mlp_only_layers);
  io.field("qkv_bias", c.qkv_bias, true);
  io.field("use_sliding_window", c.use_sliding_window, false);
  io.field("sliding_window", c.sliding_window, std::nullopt);
  // transformers writes sliding_window 0 when use_sliding_window is false.
  if (c.sliding_window == 0) c.sliding_window.reset();
  io.field("max_window_layers", c.max_window_layers, 28);
  if (const FieldReader* r = io.reader()) {
    for (const std::string& kind : r->string_list("layer_types")) {
      if (kind != "full_attention") {
        r->fail(str_of("config field 'layer_types' holds '", kind, "'"),
                "TierMoE implements full causal attention only: every entry must be "
                "\"full_attention\" (and use_sliding_window false)");
      }
    }
  }
}

void validate(const ModelConfig& c, const std::string& where) {
  TIERMOE_CHECK(c.shared_expert_intermediate_size > 0,
                str_of("config field 'shared_expert_intermediate_size' must be positive, got ",
                       c.shared_expert_intermediate_size),
                where, "Qwen2-MoE runs a shared expert of that width in every MoE layer");
}

}  // namespace

const FamilyDef& qwen2_moe() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::qwen2_moe,
               .model_type = "qwen2_moe",
               .architecture = "Qwen2MoeForCausalLM",
               .transformers_version = "4.51.0",
               .shared_expert_gated = true,
               .shared_expert = "shared_expert"},
      .fields = fields,
      .validate = validate,
  };
  return def;
}

}  // namespace tiermoe::families
