// Qwen3.5-MoE's text model (Qwen3_5MoeTextConfig, the Qwen3-Next
// architecture): layer_types mixes "linear_attention" layers (Gated
// DeltaNet, model/gated_deltanet.h) with "full_attention" ones (Qwen3's
// attention with an output gate: q_proj also gives each head a sigmoid gate
// on its output), RoPE on a quarter of each head, every RMSNorm but the
// DeltaNet's gated one scaling by 1 + w; every layer MoE, Qwen2-MoE's block
// (a shared expert under a sigmoid gate) with the top K always renormalised.
#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe::families {

namespace {

using detail::str_of;

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 248320,
                 .hidden_size = 2048,
                 .num_hidden_layers = 40,
                 .num_attention_heads = 16,
                 .num_key_value_heads = 2,
                 .num_experts_per_tok = 8,
                 .max_position_embeddings = 32768,
                 .rope_theta = 10000.0,
                 .rms_norm_eps = 1e-6});
  io.field("head_dim", c.head_dim, 256);
  io.field("attention_bias", c.attention_bias, false);
  io.rope_field("partial_rotary_factor", c.partial_rotary_factor, 0.25);
  io.field("moe_intermediate_size", c.moe_intermediate_size, 512);
  io.field("shared_expert_intermediate_size", c.shared_expert_intermediate_size, 512);
  io.field("num_experts", c.num_experts, 256);
  c.norm_topk_prob = true;  // the spec renormalises always; kept equal for ==
  io.field("linear_conv_kernel_dim", c.linear_conv_kernel_dim, 4);
  io.field("linear_key_head_dim", c.linear_key_head_dim, 128);
  io.field("linear_value_head_dim", c.linear_value_head_dim, 128);
  io.field("linear_num_key_heads", c.linear_num_key_heads, 16);
  io.field("linear_num_value_heads", c.linear_num_value_heads, 32);
  io.field("layer_types", c.layer_types);
  const FieldReader* r = io.reader();
  if (r && !r->has("layer_types")) {
    // transformers: a full_attention layer every full_attention_interval
    // layers (the last of each run), linear_attention between.
    const int64_t interval = r->opt_int("full_attention_interval").value_or(4);
    if (interval <= 0) {
      r->fail(str_of("config field 'full_attention_interval' is ", interval),
              "a full_attention layer every that many layers: use 1 or more (Qwen3.5: 4)");
    }
    for (int64_t l = 0; l < std::min(c.num_hidden_layers, ModelConfig::kMaxLayers); ++l) {
      c.layer_types.push_back((l + 1) % interval != 0 ? "linear_attention" : "full_attention");
    }
  }
}

void validate(const ModelConfig& c, const std::string& where) {
  TIERMOE_CHECK(int64_t(c.layer_types.size()) == c.num_hidden_layers,
                str_of("config field 'layer_types' lists ", c.layer_types.size(), " layers of ",
                       c.num_hidden_layers),
                where, "one entry per decoder layer, or none for full_attention_interval's");
  for (size_t l = 0; l < c.layer_types.size(); ++l) {
    TIERMOE_CHECK(c.layer_types[l] == "linear_attention" || c.layer_types[l] == "full_attention",
                  str_of("config field 'layer_types' holds '", c.layer_types[l], "' at layer ", l),
                  where, "Qwen3.5-MoE layers are \"linear_attention\" or \"full_attention\"");
  }
  auto positive = [&](const char* field, int64_t v) { require_positive(field, v, where); };
  positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  positive("linear_key_head_dim", c.linear_key_head_dim);
  positive("linear_value_head_dim", c.linear_value_head_dim);
  positive("linear_num_key_heads", c.linear_num_key_heads);
  positive("linear_num_value_heads", c.linear_num_value_heads);
  positive("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  TIERMOE_CHECK(c.linear_num_value_heads % c.linear_num_key_heads == 0,
                str_of("linear_num_value_heads ", c.linear_num_value_heads,
                       " is not a multiple of linear_num_key_heads ", c.linear_num_key_heads),
                where, "each key head serves the same number of value heads");
}

}  // namespace

const FamilyDef& qwen3_5_moe() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::qwen3_5_moe,
               .model_type = "qwen3_5_moe_text",
               .architecture = "Qwen3_5MoeForCausalLM",
               .transformers_version = "5.25.0",  // the release it was checked against
               .multimodal_model_type = "qwen3_5_moe",
               .attention = AttentionKind::hybrid_linear,
               .qk_norm = QkNorm::per_head,
               .zero_centred_norms = true,
               .attention_output_gate = true,
               .always_renormalize = true,
               .shared_expert_gated = true,
               .shared_expert = "shared_expert"},
      .fields = fields,
      .validate = validate,
  };
  return def;
}

}  // namespace tiermoe::families
