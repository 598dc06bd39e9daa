// The config's own rules: the layers it makes MoE, validation, the
// config.json it writes and the parameters it implies (reading config.json:
// model_config_parse.cpp; each family's fields: families/).
#include "tiermoe/io/model_config.h"

#include <algorithm>

#include "families/config_io.h"
#include "tiermoe/core/bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"

namespace tiermoe {

using detail::str_of;

std::string_view torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "float64";
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
  }
  __builtin_unreachable();
}

int64_t ModelConfig::attention_window(int64_t layer) const {
  const bool sliding = layer >= 0 && size_t(layer) < layer_types.size() &&
                       layer_types[size_t(layer)] == "sliding_attention";
  return sliding ? sliding_window.value_or(0) : 0;
}

bool ModelConfig::linear_attention(int64_t layer) const {
  return spec().attention == AttentionKind::hybrid_linear && layer >= 0 &&
         size_t(layer) < layer_types.size() && layer_types[size_t(layer)] == "linear_attention";
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0 || layer < first_k_dense_replace) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::num_moe_layers() const {
  if (num_experts <= 0 || decoder_sparse_step <= 0 || num_hidden_layers <= 0) return 0;
  // Counted without visiting every layer: a config may claim 2^63 of them.
  std::vector<int64_t> dense = mlp_only_layers;
  std::sort(dense.begin(), dense.end());
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  // The MoE layers among [0, m) by decoder_sparse_step and mlp_only_layers.
  auto moe_below = [&](int64_t m) {
    int64_t n = m / decoder_sparse_step;
    for (int64_t l : dense) {
      if (l >= 0 && l < m && (l + 1) % decoder_sparse_step == 0) --n;
    }
    return n;
  };
  const int64_t first = std::clamp<int64_t>(first_k_dense_replace, 0, num_hidden_layers);
  return moe_below(num_hidden_layers) - moe_below(first);
}

std::vector<std::string> ModelConfig::set_vocab_size(int64_t V) {
  vocab_size = V;
  std::vector<std::string> dropped;
  auto drop = [&](std::optional<int64_t>& id, const char* field) {
    if (id && *id >= V) dropped.push_back(str_of(field, " ", *id)), id.reset();
  };
  drop(bos_token_id, "bos_token_id");
  drop(pad_token_id, "pad_token_id");
  std::erase_if(eos_token_id, [&](int64_t id) {
    if (id < V) return false;
    dropped.push_back(str_of("eos_token_id ", id));
    return true;
  });
  return dropped;
}

void ModelConfig::validate(const std::string& where) const {
  auto positive = [&](const char* field, int64_t v) {
    families::require_positive(field, v, where);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  const families::FamilyDef& def = families::family_def(family);
  const std::string experts_key(def.spec.experts_key), width_key(def.spec.expert_width_key);
  positive(width_key.c_str(), moe_intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive(experts_key.c_str(), num_experts);
  positive("num_experts_per_tok", num_experts_per_tok);
  positive("decoder_sparse_step", decoder_sparse_step);
  positive("max_position_embeddings", max_position_embeddings);
  TIERMOE_CHECK(vocab_size <= kMaxVocab,
                str_of("config field 'vocab_size' is ", vocab_size, ", more than the 2^31 ids ",
                       "TierMoE's 32-bit token ids can name"),
                where, "published vocabularies have under a million tokens; fix the value");
  // Bounded before anything loops over layers or lists per-expert tensors.
  TIERMOE_CHECK(num_hidden_layers <= kMaxLayers,
                str_of("config field 'num_hidden_layers' is ", num_hidden_layers,
                       ", more than the ", kMaxLayers, " layers TierMoE accepts"),
                where, "published models have at most a few hundred layers; fix the value");
  TIERMOE_CHECK(num_experts <= kMaxExperts,
                str_of("config field '", experts_key, "' is ", num_experts, ", more than the ",
                       kMaxExperts, " experts per layer TierMoE accepts"),
                where, "published MoE models have at most a few hundred experts; fix the value");
  TIERMOE_CHECK(num_moe_layers() * num_experts <= kMaxExpertTensors,
                str_of(num_moe_layers(), " MoE layers x ", num_experts, " experts is ",
                       num_moe_layers() * num_experts, " experts in all, more than the ",
                       kMaxExpertTensors, " TierMoE accepts"),
                where, "check num_hidden_layers and the expert count");

  TIERMOE_CHECK(num_attention_heads % num_key_value_heads == 0,
                str_of("num_attention_heads ", num_attention_heads,
                       " is not a multiple of num_key_value_heads ", num_key_value_heads),
                where, "grouped-query attention shares each kv head among a whole group of heads");
  TIERMOE_CHECK(head_dim % 2 == 0, str_of("head_dim ", head_dim, " is odd"), where,
                "rotary embeddings rotate pairs of values; use an even head_dim");
  TIERMOE_CHECK(num_experts_per_tok <= num_experts,
                str_of("num_experts_per_tok (K = ", num_experts_per_tok,
                       ") exceeds the number of experts (E = ", num_experts, ")"),
                where, "each token picks K distinct experts, so K <= E");
  for (int64_t l : mlp_only_layers) {
    TIERMOE_CHECK(l >= 0 && l < num_hidden_layers,
                  str_of("config field 'mlp_only_layers' names layer ", l, " of ",
                         num_hidden_layers),
                  where, "layer indices run from 0 to num_hidden_layers - 1");
  }
  TIERMOE_CHECK(hidden_act == "silu", str_of("unsupported hidden_act '", hidden_act, "'"), where,
                "TierMoE implements SwiGLU experts: hidden_act must be \"silu\"");
  TIERMOE_CHECK(torch_dtype == "bfloat16" || torch_dtype == "float32" ||
                    torch_dtype == "float64" || torch_dtype == "float16",
                str_of("unsupported torch_dtype '", torch_dtype, "'"), where,
                "use bfloat16, float32, float64 or float16");
  TIERMOE_CHECK(rms_norm_eps > 0, str_of("rms_norm_eps must be positive, got ", rms_norm_eps),
                where, "HF models use 1e-6 or 1e-5");
  TIERMOE_CHECK(
      rope_scaling.kind == RopeScaling::Kind::none ||
          (rope_scaling.factor > 0 && rope_scaling.original_max_position_embeddings > 0 &&
           rope_scaling.beta_fast > 0 && rope_scaling.beta_slow > 0),
      str_of("yarn rope scaling with factor ", rope_scaling.factor,
             ", original_max_position_embeddings ", rope_scaling.original_max_position_embeddings,
             ", beta_fast ", rope_scaling.beta_fast, ", beta_slow ", rope_scaling.beta_slow),
      where, "yarn needs a positive factor, original_max_position_embeddings and betas");
  TIERMOE_CHECK(rope_theta > 0, str_of("rope_theta must be positive, got ", rope_theta), where,
                "HF models use 1e4 to 1e7");
  TIERMOE_CHECK(initializer_range >= 0,
                str_of("initializer_range must not be negative, got ", initializer_range), where,
                "transformers' default is 0.02");
  TIERMOE_CHECK(!pad_token_id || (*pad_token_id >= 0 && *pad_token_id < vocab_size),
                str_of("pad_token_id ", pad_token_id.value_or(0), " is outside the vocabulary (",
                       vocab_size, ")"),
                where, "pad_token_id indexes the embedding; set it below vocab_size or to null");
  auto token_in_vocab = [&](const char* field, int64_t id) {
    TIERMOE_CHECK(id >= 0 && id < vocab_size,
                  str_of("config field '", field, "' is ", id, ", outside the vocabulary [0, ",
                         vocab_size, ")"),
                  where,
                  str_of(field, " indexes the embedding; set it below vocab_size or to null"));
  };
  if (bos_token_id) token_in_vocab("bos_token_id", *bos_token_id);
  for (int64_t id : eos_token_id) token_in_vocab("eos_token_id", id);
  TIERMOE_CHECK(!clip_qkv || *clip_qkv > 0,
                str_of("clip_qkv must be positive, got ", clip_qkv.value_or(0)), where,
                "set clip_qkv to null to disable clipping");
  TIERMOE_CHECK(!use_sliding_window, "use_sliding_window is true", where,
                "TierMoE implements full causal attention only; set use_sliding_window to false");
  // Where intermediate_size is its own field (not the expert width), dense layers use it.
  TIERMOE_CHECK(width_key == "intermediate_size" || intermediate_size > 0 ||
                    num_moe_layers() == num_hidden_layers,
                "intermediate_size must be positive when some layers are dense", where, "");
  const int64_t rotary = rotary_dim();
  TIERMOE_CHECK(
      partial_rotary_factor > 0 && partial_rotary_factor <= 1 && rotary >= 2 && rotary % 2 == 0,
      str_of("partial_rotary_factor ", partial_rotary_factor, " turns ", rotary, " of ", head_dim,
             " head dims"),
      where, "RoPE turns pairs: head_dim * partial_rotary_factor must be even and > 0");
  TIERMOE_CHECK(
      first_k_dense_replace >= 0 && num_nextn_predict_layers >= 0,
      str_of("first_k_dense_replace ", first_k_dense_replace, " and num_nextn_predict_layers ",
             num_nextn_predict_layers, " must not be negative"),
      where, "fix the value in config.json");
  if (sigmoid_router()) {  // the router's own checks, named as config.json names them
    TIERMOE_CHECK(
        n_group >= 1 && topk_group >= 1 && topk_group <= n_group && num_experts % n_group == 0 &&
            num_experts / n_group >= 2 && num_experts_per_tok <= num_experts / n_group * topk_group,
        str_of("n_group ", n_group, ", topk_group ", topk_group, " and ", num_experts_per_tok,
               " of ", num_experts, " experts per token cannot route"),
        where,
        "n_group must divide n_routed_experts into groups of 2 or more, topk_group "
        "<= n_group, and num_experts_per_tok fit in topk_group groups");
  }
  if (def.validate) def.validate(*this, where);
  param_counts(*this, where);  // throws when a count overflows 64 bits
}

std::string ModelConfig::to_json() const {
  return families::write_config(families::family_def(family), *this).dump(2) + "\n";
}

void save_model_config(const ModelConfig& config, const std::string& path) {
  write_file_atomic(path, config.to_json());
}

ParamCounts param_counts(const ModelConfig& c, const std::string& where) {
  // Every product is checked: a config's sizes are untrusted until counted.
  auto mul = [&](std::initializer_list<int64_t> f) {
    return checked_product(f, "the parameter count", where);
  };
  auto add = [&](std::initializer_list<int64_t> terms) {
    int64_t sum = 0;
    for (int64_t t : terms) sum = checked_add(sum, t, "the parameter count", where);
    return sum;
  };
  const int64_t D = c.hidden_size, P = c.head_dim, H = c.num_attention_heads;
  const int64_t Hkv = c.num_key_value_heads, E = c.num_experts, K = c.num_experts_per_tok;
  ParamCounts n;
  n.embedding = mul({c.vocab_size, D});
  n.per_expert = mul({3, D, c.moe_intermediate_size});
  // gpt-oss's experts carry a bias on each projection: 2F + D.
  if (c.spec().clamped_experts)
    n.per_expert = add({n.per_expert, mul({2, c.moe_intermediate_size}), D});

  int64_t attention = add({mul({D, H, P}), mul({2, D, Hkv, P}), mul({H, P, D})});  // q, k, v, o
  if (c.q_k_v_bias()) attention = add({attention, mul({H, P}), mul({2, Hkv, P})});
  if (c.attention_bias) attention = add({attention, D});
  if (c.mla()) {  // q_a_proj + q_a_layernorm + q_b_proj (or q_proj), kv_a, its norm, kv_b, o
    const int64_t Q = c.qk_head_dim(), Rq = c.q_lora_rank, Rkv = c.kv_lora_rank;
    const int64_t q = Rq > 0 ? add({mul({D, Rq}), Rq, mul({Rq, H, Q})}) : mul({D, H, Q});
    const int64_t kv_a = mul({D, add({Rkv, c.qk_rope_head_dim})});
    attention = add({q, kv_a, Rkv, mul({Rkv, H, add({c.qk_nope_head_dim, c.v_head_dim})}),
                     mul({H, c.v_head_dim, D})});
    // attention_bias: on q_a_proj (not q_proj), kv_a_proj_with_mqa and o_proj.
    if (c.attention_bias) {
      attention = add({attention, Rq, add({Rkv, c.qk_rope_head_dim}), D});
    }
  }
  if (c.spec().attention_sinks) attention = add({attention, H});  // a sink logit per head
  switch (c.qk_norm()) {
    case QkNorm::none: break;
    case QkNorm::per_head: attention = add({attention, mul({2, P})}); break;
    case QkNorm::whole: attention = add({attention, mul({H, P}), mul({Hkv, P})}); break;
  }
  // Qwen3.5's output gate: q_proj gives a gate beside each query.
  if (c.spec().attention_output_gate) attention = add({attention, mul({D, H, P})});
  // Gated DeltaNet's layers (layer_types' linear_attention): in_proj_qkv, z,
  // b and a, out_proj, the conv, A_log and dt_bias, the gated norm.
  int64_t linear_layers = 0, linear = 0;
  if (c.spec().attention == AttentionKind::hybrid_linear) {
    linear_layers = std::count(c.layer_types.begin(), c.layer_types.end(), "linear_attention");
    const int64_t Hv = c.linear_num_value_heads, Vw = mul({Hv, c.linear_value_head_dim});
    const int64_t Cw = add({mul({2, c.linear_num_key_heads, c.linear_key_head_dim}), Vw});
    linear = add({mul({D, Cw}), mul({D, Vw}), mul({2, D, Hv}), mul({Vw, D}),
                  mul({Cw, c.linear_conv_kernel_dim}), mul({2, Hv}), c.linear_value_head_dim});
  }
  // Each layer's attention, plus its input and post-attention norms.
  const int64_t attention_params =
      add({mul({c.num_hidden_layers - linear_layers, attention}), mul({linear_layers, linear}),
           mul({c.num_hidden_layers, 2, D})});
  const int64_t moe_layers = c.num_moe_layers();
  const int64_t dense_layers = c.num_hidden_layers - moe_layers;

  n.experts = mul({moe_layers, E, n.per_expert});
  // A shared expert's gate, up and down projections, and Qwen2-MoE's [1, D] gate.
  const int64_t shared =
      c.has_shared_expert()
          ? add({mul({3, D, c.shared_expert_intermediate_size}), c.shared_expert_gated() ? D : 0})
          : 0;
  // The sigmoid router's e_score_correction_bias or gpt-oss's router bias, [E] per MoE layer.
  const int64_t router_bias =
      c.spec().router == RouterRule::sigmoid_grouped || c.spec().router == RouterRule::topk_softmax
          ? E
          : 0;
  n.total = add({n.embedding, D, c.tie_word_embeddings ? 0 : n.embedding, attention_params,
                 mul({moe_layers, E, D}) /* routers */, n.experts, mul({moe_layers, shared}),
                 mul({moe_layers, router_bias}), mul({dense_layers, 3, D, c.intermediate_size})});
  n.active_per_token = n.total - mul({moe_layers, std::max<int64_t>(E - K, 0), n.per_expert});
  return n;
}

}  // namespace tiermoe
