// DeepSeek-V2 (DeepseekV2Config; V2-Lite, V2.5): DeepSeek-V3's multi-head
// latent attention and dense-then-MoE layers with its own router: a softmax
// over the experts, chosen greedily or within the topk_group groups holding
// the best single scores, weighted by those scores times
// routed_scaling_factor (never renormalised, no selection bias, no aux loss
// in transformers' model). Its rope turns the dims as complex pairs, which
// is V3's interleaved rope (the same pairs, so the same attention).
#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe::families {

namespace {

using detail::str_of;

constexpr const char* kGreedy = "greedy";
constexpr const char* kGroupLimited = "group_limited_greedy";

void router_fields(ConfigIo& io, ModelConfig& c) {
  io.field("n_routed_experts", c.num_experts, 64);
  shared_experts_field(io, c, 2);
  io.field("routed_scaling_factor", c.routed_scaling_factor, 1.0);
  io.field("topk_method", c.topk_method, kGreedy);
  // n_group and topk_group are null unless given (0 here); greedy ignores them.
  auto optional_count = [&io](const char* key, int64_t& v) {
    std::optional<int64_t> count = v > 0 ? std::optional(v) : std::nullopt;
    io.field(key, count, std::nullopt);
    v = count.value_or(0);
  };
  optional_count("n_group", c.n_group);
  optional_count("topk_group", c.topk_group);
  // transformers' router drops norm_topk_prob; DeepSeek's own code would
  // renormalise when it is true. Every release ships false: only that is read.
  io.fixed("norm_topk_prob", false,
           "transformers' DeepSeek-V2 never renormalises the top-k weights (DeepSeek's own "
           "code does when this is true): set norm_topk_prob to false");
  io.fixed("scoring_func", "softmax", "DeepSeek-V2's architecture scores experts by softmax");
  io.fixed("moe_layer_freq", 1,
           "DeepSeek-V2's architecture makes every layer from first_k_dense_replace on MoE: "
           "set moe_layer_freq to 1");
  c.output_router_logits = false;  // transformers adds no load-balancing loss
}

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 102400,
                 .hidden_size = 4096,
                 .num_hidden_layers = 32,
                 .num_attention_heads = 32,
                 .num_key_value_heads = std::nullopt,
                 .num_experts_per_tok = 0,  // null in the class: required (below)
                 .max_position_embeddings = 2048,
                 .rope_theta = 10000.0,
                 .rms_norm_eps = 1e-6,
                 .bos_token_id = 1,
                 .eos_token_id = {2}});
  if (const FieldReader* r = io.reader(); r && !r->has("num_experts_per_tok")) {
    r->fail("config field 'num_experts_per_tok' is absent or null",
            "DeepseekV2Config has no default for it (its router cannot run without one): "
            "DeepSeek-V2 and V2-Lite route each token to 6 experts");
  }
  io.field("intermediate_size", c.intermediate_size, 11008);
  io.field("moe_intermediate_size", c.moe_intermediate_size, 1407);
  router_fields(io, c);
  io.field("first_k_dense_replace", c.first_k_dense_replace, 0);
  io.fixed("mlp_bias", false, "TierMoE's MLPs have no bias: set mlp_bias to false");
  mla_fields(
      io, c,
      {.q_lora_rank = 1536, .qk_nope_head_dim = 128, .v_head_dim = 128, .interleave_field = false});
}

void validate(const ModelConfig& c, const std::string& where) {
  validate_mla(c, where);
  TIERMOE_CHECK(c.topk_method == kGreedy || c.topk_method == kGroupLimited,
                str_of("config field 'topk_method' is '", c.topk_method, "'"), where,
                "DeepSeek-V2 routes by \"greedy\" or \"group_limited_greedy\"");
  if (c.topk_method != kGroupLimited) return;
  const int64_t G = c.n_group, kept = c.topk_group, E = c.num_experts;
  TIERMOE_CHECK(
      G >= 1 && kept >= 1 && kept <= G && E % G == 0 && c.num_experts_per_tok <= E / G * kept,
      str_of("n_group ", G, ", topk_group ", kept, " and ", c.num_experts_per_tok, " of ", E,
             " experts per token cannot route group-limited"),
      where,
      "n_group must divide n_routed_experts, topk_group be in [1, n_group], and "
      "num_experts_per_tok fit in topk_group groups");
}

}  // namespace

const FamilyDef& deepseek_v2() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::deepseek_v2,
               .model_type = "deepseek_v2",
               .architecture = "DeepseekV2ForCausalLM",
               .transformers_version = "5.25.0",  // the release it was checked against
               .attention = AttentionKind::mla,
               .router = RouterRule::softmax_grouped,
               .experts_key = "n_routed_experts"},
      .fields = fields,
      .validate = validate,
  };
  return def;
}

}  // namespace tiermoe::families
