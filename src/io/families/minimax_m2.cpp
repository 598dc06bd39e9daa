// MiniMax-M2 (MiniMaxM2Config; M2.1 and M2.5 share it): Mixtral's block and
// checkpoint names (block_sparse_moe, experts w1/w3/w2) with DeepSeek-V3's
// sigmoid router in its plainest form: experts chosen on sigmoid +
// e_score_correction_bias (held by the block, not the router), no groups,
// the chosen sigmoids renormalised, no scaling. OLMoE's attention (q and k
// normalised over the whole projection) with RoPE on part of each head,
// which released configs give as rotary_dim.
#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe::families {

namespace {

using detail::str_of;

// What MiniMax's own configuration code names and transformers computes one
// way only: read, each must say what transformers does.
void fixed_fields(ConfigIo& io) {
  io.fixed("use_qk_norm", true,
           "transformers' MiniMax-M2 always normalises q and k: set use_qk_norm to true");
  io.fixed("qk_norm_type", "per_layer",
           "transformers' MiniMax-M2 normalises q and k over the whole projection (per_layer)");
  io.fixed("scoring_func", "sigmoid", "MiniMax-M2's architecture scores experts by sigmoid");
  io.fixed("use_routing_bias", true,
           "transformers' MiniMax-M2 always chooses with e_score_correction_bias");
  io.fixed("shared_intermediate_size", 0, "MiniMax-M2's architecture has no shared expert");
  io.fixed("router_jitter_noise", 0.0, "TierMoE routes without jitter; set it to 0.0");
  // transformers would add Mixtral's aux loss over a softmax of the sigmoid
  // router's logits; TierMoE does not implement that loss.
  io.fixed("output_router_logits", false,
           "MiniMax-M2's load-balancing loss (a softmax over its sigmoid router's logits) is "
           "not implemented: set output_router_logits to false (released configs have false)");
}

// MiniMax-Text-01's layer kinds: 1 is softmax attention, every MiniMax-M2 layer's.
void attention_kinds(const FieldReader& r) {
  if (!r.has("attn_type_list")) return;
  const std::vector<int64_t> kinds = r.int_list("attn_type_list");
  for (size_t l = 0; l < kinds.size(); ++l) {
    if (kinds[l] != 1) {
      r.fail(str_of("config field 'attn_type_list' holds ", kinds[l], " at layer ", l),
             "TierMoE runs MiniMax-M2's softmax attention (1) on every layer, as transformers "
             "does; MiniMax-Text-01's lightning attention (0) is another architecture");
    }
  }
}

void fields(ConfigIo& io, ModelConfig& c) {
  common_fields(io, c,
                {.vocab_size = 200064,
                 .hidden_size = 3072,
                 .num_hidden_layers = 62,
                 .num_attention_heads = 48,
                 .num_key_value_heads = 8,
                 .num_experts_per_tok = 8,
                 .max_position_embeddings = 196608,
                 .rope_theta = 5e6,
                 .rms_norm_eps = 1e-6,
                 .bos_token_id = 200034,
                 .eos_token_id = {200020}});
  io.field("head_dim", c.head_dim, 128);  // not hidden_size / heads (64) by default
  io.field("intermediate_size", c.moe_intermediate_size, 1536);
  c.intermediate_size = c.moe_intermediate_size;
  io.field("num_local_experts", c.num_experts, 256);
  c.norm_topk_prob = true;  // the spec renormalises always; kept equal for ==
  fixed_fields(io);
  io.rope_field("partial_rotary_factor", c.partial_rotary_factor, 1.0);
  if (const FieldReader* r = io.reader()) {
    // rotary_dim, as released configs give the partial rope, unless the
    // factor itself is given (transformers' setdefault).
    const Json* rope = r->object("rope_parameters");
    const bool factor_given = r->has("partial_rotary_factor") ||
                              (rope && FieldReader(*rope, r->path()).has("partial_rotary_factor"));
    if (auto rotary_dim = r->opt_int("rotary_dim"); rotary_dim && !factor_given) {
      c.partial_rotary_factor = double(*rotary_dim) / double(c.head_dim);
    }
    attention_kinds(*r);
  }
}

}  // namespace

const FamilyDef& minimax_m2() {
  static const FamilyDef def{
      .spec = {.family = ModelFamily::minimax_m2,
               .model_type = "minimax_m2",
               .architecture = "MiniMaxM2ForCausalLM",
               .transformers_version = "5.25.0",  // the release it was checked against
               .qk_norm = QkNorm::whole,
               .router = RouterRule::sigmoid_grouped,
               .always_renormalize = true,
               .expert_lora = false,  // as Mixtral's w1/w3/w2 names
               .moe_block = "block_sparse_moe",
               .expert_projections = {"w1", "w3", "w2"},
               .selection_bias_on_block = true,
               .router_renamed_in_v5 = true,
               .experts_key = "num_local_experts",
               .expert_width_key = "intermediate_size"},
      .fields = fields,
  };
  return def;
}

}  // namespace tiermoe::families
