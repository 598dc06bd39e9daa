// gpt-oss (GptOssConfig): every layer MoE (intermediate_size is the expert
// width), sliding and full attention alternating, a learned sink per head,
// q/k/v/o biases, YaRN RoPE by default; a biased router whose top K logits
// are softmaxed; the clamped SwiGLU experts with biases, stored fused and
// x-major and shipped in MXFP4; RMSNorm rounding after its weight.
#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe::families {

namespace {

using detail::str_of;

// GptOssConfig's default: YaRN, factor 32 over 4096 positions, no truncation.
RopeScaling default_rope_scaling() {
  RopeScaling s;
  s.kind = RopeScaling::Kind::yarn;
  s.factor = 32.0;
  s.original_max_position_embeddings = 4096;
  s.truncate = false;
  return s;
}

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 201088,
                 .hidden_size = 2880,
                 .num_hidden_layers = 36,
                 .num_attention_heads = 64,
                 .num_key_value_heads = 8,
                 .num_experts_per_tok = 4,
                 .max_position_embeddings = 131072,
                 .rope_theta = 150000.0,
                 .rms_norm_eps = 1e-5,
                 .rope_scaling = default_rope_scaling()});
  // head_dim defaults to 64 (not D / H: 2880 / 64 is 45); null means D / H.
  const FieldReader* r = io.reader();
  if (r && !r->present("head_dim")) {
    c.head_dim = 64;
  } else {
    io.head_dim(c, HeadDimField::always);
  }
  io.field("intermediate_size", c.moe_intermediate_size, 2880);
  c.intermediate_size = c.moe_intermediate_size;
  io.aliased("num_local_experts", "num_experts", c.num_experts, 128);
  c.norm_topk_prob = false;  // the router softmaxes over the K chosen logits
  io.field("attention_bias", c.attention_bias, true);
  io.field("sliding_window", c.sliding_window, 128);
  io.field("layer_types", c.layer_types);
  if (r && !r->has("layer_types")) {  // transformers: sliding on even layers, full on odd ones
    for (int64_t l = 0; l < std::min(c.num_hidden_layers, ModelConfig::kMaxLayers); ++l) {
      c.layer_types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
    }
  }
  for (const char* key : {"swiglu_alpha", "swiglu_limit"}) {
    if (r && r->present(key) && !r->has(key)) {  // transformers would multiply by None
      r->fail(str_of("config field '", key, "' is null"),
              "give it a number, or leave it out for GptOssConfig's default");
    }
  }
  io.field("swiglu_alpha", c.swiglu_alpha, 1.702);
  io.field("swiglu_limit", c.swiglu_limit, 7.0);
}

void validate(const ModelConfig& c, const std::string& where) {
  TIERMOE_CHECK(int64_t(c.layer_types.size()) == c.num_hidden_layers,
                str_of("config field 'layer_types' lists ", c.layer_types.size(), " layers of ",
                       c.num_hidden_layers),
                where, "one entry per decoder layer, or none for gpt-oss's alternation");
  for (const std::string& kind : c.layer_types) {
    TIERMOE_CHECK(kind == "sliding_attention" || kind == "full_attention",
                  str_of("config field 'layer_types' holds '", kind, "'"), where,
                  "gpt-oss layers are \"sliding_attention\" or \"full_attention\"");
    TIERMOE_CHECK(kind == "full_attention" || c.sliding_window.value_or(0) > 0,
                  str_of("sliding_attention layers with sliding_window ",
                         c.sliding_window ? std::to_string(*c.sliding_window) : "null"),
                  where, "set sliding_window to the window's length in tokens (gpt-oss: 128)");
  }
  TIERMOE_CHECK(c.swiglu_limit > 0 && c.swiglu_alpha > 0,
                str_of("swiglu_alpha ", c.swiglu_alpha, ", swiglu_limit ", c.swiglu_limit), where,
                "gpt-oss uses swiglu_alpha 1.702 and swiglu_limit 7.0 (both positive)");
}

}  // namespace

const FamilyDef& gpt_oss() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::gpt_oss,
               .model_type = "gpt_oss",
               .architecture = "GptOssForCausalLM",
               .transformers_version = "4.55.0",  // gpt-oss's first release
               .attention_sinks = true,
               .norm_cast_after_weight = true,
               .router = RouterRule::topk_softmax,
               .clamped_experts = true,
               .router_name = "router",
               .expert_layout = ExpertLayout::fused_x_major,
               .experts_key = "num_local_experts",
               .expert_width_key = "intermediate_size",
               .shipped_experts = "mxfp4"},
      .fields = fields,
      .validate = validate,
  };
  return def;
}

}  // namespace tiermoe::families
