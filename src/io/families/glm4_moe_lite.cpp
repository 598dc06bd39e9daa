// GLM-4.7-Flash (Glm4MoeLiteConfig): GLM-4.5's MoE (sigmoid group-limited
// routing, ungated shared experts) under DeepSeek-V3's multi-head latent
// attention. What differs from DeepSeek-V3 is the config: which layers are
// dense is a list (mlp_layer_types) and the class has no MTP-layer count.
#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe::families {

namespace {

using detail::str_of;

// mlp_layer_types: "dense" for the first layers, then "sparse" (MoE); the
// model holds that form only (first_k_dense_replace).
void layer_kinds(ConfigIo& io, ModelConfig& c) {
  const FieldReader* r = io.reader();
  std::vector<std::string> kinds;
  for (int64_t l = 0; !r && l < c.num_hidden_layers; ++l) {
    kinds.push_back(l < c.first_k_dense_replace ? "dense" : "sparse");
  }
  io.field("mlp_layer_types", kinds);
  if (!r) return;
  if (!r->has("mlp_layer_types")) {  // the class default: the first layer dense
    c.first_k_dense_replace = std::min<int64_t>(1, c.num_hidden_layers);
    return;
  }
  if (int64_t(kinds.size()) != c.num_hidden_layers) {
    r->fail(str_of("config field 'mlp_layer_types' lists ", kinds.size(), " layers of ",
                   c.num_hidden_layers),
            "give one kind per layer, \"dense\" or \"sparse\"");
  }
  int64_t dense = 0;
  while (dense < int64_t(kinds.size()) && kinds[size_t(dense)] == "dense") ++dense;
  for (size_t l = size_t(dense); l < kinds.size(); ++l) {
    if (kinds[l] != "sparse") {
      r->fail(str_of("config field 'mlp_layer_types' holds '", kinds[l], "' at layer ", l),
              "TierMoE runs dense layers first, then MoE (\"sparse\") ones, as GLM-4.7-Flash "
              "has them");
    }
  }
  c.first_k_dense_replace = dense;
}

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 154880,
                 .hidden_size = 2048,
                 .num_hidden_layers = 47,
                 .num_attention_heads = 20,
                 .num_key_value_heads = 20,
                 .num_experts_per_tok = 4,
                 .max_position_embeddings = 202752,
                 .rope_theta = 10000.0,
                 .rms_norm_eps = 1e-5,
                 .bos_token_id = 0,
                 .eos_token_id = {1}});
  io.field("intermediate_size", c.intermediate_size, 10240);
  io.field("moe_intermediate_size", c.moe_intermediate_size, 1536);
  sigmoid_router_fields(
      io, c, {.n_routed_experts = 64, .n_group = 1, .topk_group = 1, .routed_scaling_factor = 1.8});
  layer_kinds(io, c);
  mla_fields(io, c, {.q_lora_rank = 768, .qk_nope_head_dim = 192, .v_head_dim = 256});
  // transformers skips the MTP layer by its name (model.layers.47); a
  // config.json that counts it says which layers to skip.
  if (io.reader() || c.num_nextn_predict_layers > 0) {
    io.aliased("num_nextn_predict_layers", "num_mtp_layers", c.num_nextn_predict_layers, 0);
  }
  // The rotary embedding takes partial_rotary_factor from rope_parameters;
  // MLA here ropes all qk_rope_head_dim values (validate).
  io.rope_field("partial_rotary_factor", c.partial_rotary_factor, 1.0);
}

void validate(const ModelConfig& c, const std::string& where) {
  validate_mla(c, where);
  TIERMOE_CHECK(c.partial_rotary_factor == 1.0,
                str_of("partial_rotary_factor ", c.partial_rotary_factor,
                       " under multi-head latent attention"),
                where,
                "TierMoE ropes every qk_rope_head_dim value (a partial rope within them is not "
                "implemented): set partial_rotary_factor to 1, or leave it out");
}

}  // namespace

const FamilyDef& glm4_moe_lite() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::glm4_moe_lite,
               .model_type = "glm4_moe_lite",
               .architecture = "Glm4MoeLiteForCausalLM",
               .transformers_version = "5.25.0",  // the release it was checked against
               .attention = AttentionKind::mla,
               .router = RouterRule::sigmoid_grouped,
               .experts_key = "n_routed_experts"},
      .fields = fields,
      .validate = validate,
  };
  return def;
}

}  // namespace tiermoe::families
