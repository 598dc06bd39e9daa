// Reading config.json: the per-family field names and transformers' class
// defaults, strictly (model_config.h says what is refused).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "quant_config.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {

namespace {

using Json = nlohmann::json;
using detail::str_of;

constexpr std::string_view kSupportedTypes =
    "qwen3_moe, qwen2_moe, glm4_moe, gpt_oss, deepseek_v3 (kimi_k2), mixtral, olmoe";

// Reads typed fields of one config.json, naming the file and field on error.
// A JSON null counts as absent, as it does for transformers' optional fields.
class FieldReader {
 public:
  FieldReader(const Json& j, const std::string& path) : j_(j), path_(path) {}

  bool present(const char* key) const { return j_.contains(key); }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  std::optional<int64_t> opt_int(const char* key) const {
    if (!has(key)) return std::nullopt;
    const Json& v = j_.at(key);
    if (!v.is_number_integer()) type_error(key, "an integer", v);
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) {
      type_error(key, "an integer below 2^63", v);
    }
    return v.get<int64_t>();
  }
  int64_t get_int(const char* key, int64_t dflt) const { return opt_int(key).value_or(dflt); }

  std::optional<double> opt_double(const char* key) const {
    if (!has(key)) return std::nullopt;
    const Json& v = j_.at(key);
    if (!v.is_number()) type_error(key, "a number", v);
    return v.get<double>();
  }
  double get_double(const char* key, double dflt) const { return opt_double(key).value_or(dflt); }

  bool get_bool(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const Json& v = j_.at(key);
    if (!v.is_boolean()) type_error(key, "true or false", v);
    return v.get<bool>();
  }

  std::optional<std::string> opt_string(const char* key) const {
    if (!has(key)) return std::nullopt;
    const Json& v = j_.at(key);
    if (!v.is_string()) type_error(key, "a string", v);
    return v.get<std::string>();
  }

  std::vector<int64_t> int_list(const char* key) const {
    std::vector<int64_t> out;
    if (!has(key)) return out;
    const Json& v = j_.at(key);
    if (!v.is_array()) type_error(key, "a list of integers", v);
    for (const Json& x : v) {
      if (!x.is_number_integer()) type_error(key, "a list of integers", v);
      out.push_back(x.get<int64_t>());
    }
    return out;
  }

  std::vector<std::string> string_list(const char* key) const {
    std::vector<std::string> out;
    if (!has(key)) return out;
    const Json& v = j_.at(key);
    if (!v.is_array()) type_error(key, "a list of strings", v);
    for (const Json& x : v) {
      if (!x.is_string()) type_error(key, "a list of strings", v);
      out.push_back(x.get<std::string>());
    }
    return out;
  }

  // eos_token_id may be one id or a list of ids.
  std::vector<int64_t> int_or_int_list(const char* key) const {
    if (has(key) && j_.at(key).is_number_integer()) return {j_.at(key).get<int64_t>()};
    return int_list(key);
  }

  const Json* object(const char* key) const {
    if (!has(key)) return nullptr;
    const Json& v = j_.at(key);
    if (!v.is_object()) type_error(key, "an object", v);
    return &v;
  }

  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& what, const std::string& hint) const {
    throw Error(what, path_, hint);
  }

 private:
  [[noreturn]] void type_error(const char* key, const char* want, const Json& got) const {
    fail(str_of("config field '", key, "' must be ", want, ", got ", got.type_name(), " ",
                got.dump()),
         "fix the value in config.json (transformers writes it with that JSON type)");
  }

  const Json& j_;
  const std::string& path_;
};

ModelFamily parse_family(const std::string& type, const std::string& path) {
  if (type == "qwen3_moe") return ModelFamily::qwen3_moe;
  if (type == "mixtral") return ModelFamily::mixtral;
  if (type == "olmoe") return ModelFamily::olmoe;
  if (type == "qwen2_moe") return ModelFamily::qwen2_moe;
  if (type == "glm4_moe") return ModelFamily::glm4_moe;
  if (type == "gpt_oss") return ModelFamily::gpt_oss;
  // Kimi-K2 ships DeepSeek-V3's architecture under its own model_type.
  if (type == "deepseek_v3" || type == "kimi_k2") return ModelFamily::deepseek_v3;
  throw Error(str_of("unsupported model_type '", type, "'"), path,
              str_of("TierMoE supports model_type ", kSupportedTypes));
}

// RoPE: v4 keeps rope_theta at the top level and scaling in rope_scaling; v5
// moves both into rope_parameters. Plain RoPE and YaRN are implemented.
void parse_rope(const FieldReader& f, ModelConfig& c, double default_theta) {
  c.rope_theta = f.get_double("rope_theta", default_theta);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const Json* rope = f.object(key);
    if (!rope) continue;
    FieldReader r(*rope, f.path());
    std::string type = r.opt_string("rope_type").value_or(r.opt_string("type").value_or("default"));
    if (auto theta = r.opt_double("rope_theta")) c.rope_theta = *theta;
    if (type == "default") continue;
    if (type != "yarn") {
      f.fail(str_of("config field '", key, "' asks for RoPE type '", type, "'"),
             "TierMoE implements plain RoPE and yarn; set the field to null for plain RoPE");
    }
    RopeScaling& s = c.rope_scaling;
    s.kind = RopeScaling::Kind::yarn;
    // transformers: a missing factor is max_position_embeddings / original.
    s.original_max_position_embeddings = r.get_int(
        "original_max_position_embeddings", f.get_int("original_max_position_embeddings", 0));
    // Absent, it is max_position_embeddings / original (below); 0 is not
    // "absent" but a value transformers' RoPE validation refuses.
    s.factor = 0.0;
    if (auto factor = r.opt_double("factor")) {
      if (!(*factor > 0)) {
        f.fail(str_of("config field '", key, "' has yarn factor ", *factor),
               "YaRN's factor is positive; leave it out for max_position_embeddings / "
               "original_max_position_embeddings");
      }
      s.factor = *factor;
    }
    s.beta_fast = r.get_double("beta_fast", 32.0);
    s.beta_slow = r.get_double("beta_slow", 1.0);
    s.truncate = r.get_bool("truncate", true);
    s.attention_factor = r.opt_double("attention_factor");
    s.mscale = r.opt_double("mscale");
    s.mscale_all_dim = r.opt_double("mscale_all_dim");
  }
  RopeScaling& s = c.rope_scaling;
  if (s.kind == RopeScaling::Kind::yarn) {
    if (s.original_max_position_embeddings == 0) {
      s.original_max_position_embeddings = c.max_position_embeddings;
    }
    if (s.factor == 0.0 && s.original_max_position_embeddings > 0) {
      s.factor = double(c.max_position_embeddings) / double(s.original_max_position_embeddings);
    }
  }
}

// Token ids: absent takes the family default, null means none.
std::optional<int64_t> token_id(const FieldReader& f, const char* key,
                                std::optional<int64_t> dflt) {
  if (!f.present(key)) return dflt;
  return f.opt_int(key);
}

// Fields every family shares. `kv_default` is the class default of
// num_key_value_heads when the key is absent; null (or no default) means one
// kv head per query head, as transformers does.
void parse_common(const FieldReader& f, ModelConfig& c, std::optional<int64_t> kv_default) {
  c.hidden_act = f.opt_string("hidden_act").value_or("silu");
  c.initializer_range = f.get_double("initializer_range", 0.02);
  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", false);
  c.output_router_logits = f.get_bool("output_router_logits", false);
  c.attention_dropout = f.get_double("attention_dropout", 0.0);
  // v5 renamed torch_dtype to dtype. Absent means float32, transformers' default.
  c.torch_dtype = f.opt_string("dtype").value_or(f.opt_string("torch_dtype").value_or("float32"));
  if (f.has("num_key_value_heads")) {
    c.num_key_value_heads = *f.opt_int("num_key_value_heads");
  } else if (!f.present("num_key_value_heads") && kv_default) {
    c.num_key_value_heads = *kv_default;
  } else {
    c.num_key_value_heads = c.num_attention_heads;
  }
}

void parse_head_dim(const FieldReader& f, ModelConfig& c, bool has_field) {
  if (has_field && f.has("head_dim")) {
    c.head_dim = *f.opt_int("head_dim");
    return;
  }
  if (c.num_attention_heads <= 0) return;  // validate() reports it
  if (c.hidden_size % c.num_attention_heads != 0) {
    f.fail(str_of("hidden_size ", c.hidden_size, " is not divisible by num_attention_heads ",
                  c.num_attention_heads, " and head_dim is absent"),
           has_field ? "set head_dim explicitly, or make hidden_size a multiple of the heads"
                     : "this family has no head_dim field: hidden_size must be a multiple of "
                       "num_attention_heads");
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
}

// The expert count under `key` or its alias (transformers 5's
// num_local_experts); both present must agree.
int64_t expert_count(const FieldReader& f, const char* key, const char* alias, int64_t dflt) {
  auto e = f.opt_int(key), e_alias = f.opt_int(alias);
  if (e && e_alias && *e != *e_alias) {
    f.fail(str_of(key, " (", *e, ") and ", alias, " (", *e_alias, ") disagree"),
           "keep one of the two fields");
  }
  return e ? *e : e_alias.value_or(dflt);
}

void parse_qwen3_moe(const FieldReader& f, ModelConfig& c) {
  c.vocab_size = f.get_int("vocab_size", 151936);
  c.hidden_size = f.get_int("hidden_size", 2048);
  c.intermediate_size = f.get_int("intermediate_size", 6144);
  c.moe_intermediate_size = f.get_int("moe_intermediate_size", 768);
  c.num_hidden_layers = f.get_int("num_hidden_layers", 24);
  c.num_attention_heads = f.get_int("num_attention_heads", 32);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 32768);
  parse_common(f, c, 4);
  parse_head_dim(f, c, true);
  c.num_experts = expert_count(f, "num_experts", "num_local_experts", 128);
  c.num_experts_per_tok = f.get_int("num_experts_per_tok", 8);
  c.norm_topk_prob = f.get_bool("norm_topk_prob", false);
  c.decoder_sparse_step = f.get_int("decoder_sparse_step", 1);
  c.mlp_only_layers = f.int_list("mlp_only_layers");
  parse_rope(f, c, 10000.0);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-6);
  c.router_aux_loss_coef = f.get_double("router_aux_loss_coef", 0.001);
  c.attention_bias = f.get_bool("attention_bias", false);
  c.use_sliding_window = f.get_bool("use_sliding_window", false);
  c.sliding_window = f.opt_int("sliding_window");
  c.max_window_layers = f.opt_int("max_window_layers");
  c.bos_token_id = token_id(f, "bos_token_id", std::nullopt);
  c.eos_token_id = f.int_or_int_list("eos_token_id");
  c.pad_token_id = token_id(f, "pad_token_id", std::nullopt);
}

void parse_mixtral(const FieldReader& f, ModelConfig& c) {
  c.vocab_size = f.get_int("vocab_size", 32000);
  c.hidden_size = f.get_int("hidden_size", 4096);
  // Mixtral's intermediate_size is the expert width; every layer is MoE.
  c.moe_intermediate_size = f.get_int("intermediate_size", 14336);
  c.intermediate_size = c.moe_intermediate_size;
  c.num_hidden_layers = f.get_int("num_hidden_layers", 32);
  c.num_attention_heads = f.get_int("num_attention_heads", 32);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 4096 * 32);
  parse_common(f, c, 8);
  parse_head_dim(f, c, true);
  c.num_experts = f.get_int("num_local_experts", 8);
  c.num_experts_per_tok = f.get_int("num_experts_per_tok", 2);
  c.norm_topk_prob = true;  // Mixtral always renormalises the top-K weights
  parse_rope(f, c, 1e6);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-5);
  c.router_aux_loss_coef = f.get_double("router_aux_loss_coef", 0.001);
  c.sliding_window = f.opt_int("sliding_window");
  c.bos_token_id = token_id(f, "bos_token_id", 1);
  c.eos_token_id =
      f.present("eos_token_id") ? f.int_or_int_list("eos_token_id") : std::vector<int64_t>{2};
  c.pad_token_id = token_id(f, "pad_token_id", std::nullopt);
  if (f.get_double("router_jitter_noise", 0.0) != 0.0) {
    f.fail("config field 'router_jitter_noise' is not zero",
           "TierMoE routes without jitter; set it to 0.0");
  }
}

void parse_olmoe(const FieldReader& f, ModelConfig& c) {
  c.vocab_size = f.get_int("vocab_size", 50304);
  c.hidden_size = f.get_int("hidden_size", 2048);
  // OLMoE's intermediate_size is the expert width; every layer is MoE.
  c.moe_intermediate_size = f.get_int("intermediate_size", 2048);
  c.intermediate_size = c.moe_intermediate_size;
  c.num_hidden_layers = f.get_int("num_hidden_layers", 16);
  c.num_attention_heads = f.get_int("num_attention_heads", 16);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 4096);
  parse_common(f, c, std::nullopt);
  // OlmoeConfig has no head_dim: heads always split hidden_size evenly.
  parse_head_dim(f, c, false);
  c.num_experts = f.get_int("num_experts", 64);
  c.num_experts_per_tok = f.get_int("num_experts_per_tok", 8);
  c.norm_topk_prob = f.get_bool("norm_topk_prob", false);
  parse_rope(f, c, 10000.0);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-5);
  c.router_aux_loss_coef = f.get_double("router_aux_loss_coef", 0.01);
  c.attention_bias = f.get_bool("attention_bias", false);
  c.clip_qkv = f.opt_double("clip_qkv");
  c.bos_token_id = token_id(f, "bos_token_id", std::nullopt);
  c.eos_token_id =
      f.present("eos_token_id") ? f.int_or_int_list("eos_token_id") : std::vector<int64_t>{50279};
  c.pad_token_id = token_id(f, "pad_token_id", 1);
}

// Qwen2MoeConfig: Qwen3-MoE's fields without the q/k norm, with a bias on
// q, k and v_proj (qkv_bias) and a gated shared expert in every MoE layer.
void parse_qwen2_moe(const FieldReader& f, ModelConfig& c) {
  c.vocab_size = f.get_int("vocab_size", 151936);
  c.hidden_size = f.get_int("hidden_size", 2048);
  c.intermediate_size = f.get_int("intermediate_size", 5632);
  c.moe_intermediate_size = f.get_int("moe_intermediate_size", 1408);
  c.shared_expert_intermediate_size = f.get_int("shared_expert_intermediate_size", 5632);
  c.num_hidden_layers = f.get_int("num_hidden_layers", 24);
  c.num_attention_heads = f.get_int("num_attention_heads", 16);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 32768);
  parse_common(f, c, 16);
  // Qwen2MoeConfig has no head_dim field; its attention reads one when present.
  parse_head_dim(f, c, true);
  c.num_experts = f.get_int("num_experts", 60);
  c.num_experts_per_tok = f.get_int("num_experts_per_tok", 4);
  c.norm_topk_prob = f.get_bool("norm_topk_prob", false);
  c.decoder_sparse_step = f.get_int("decoder_sparse_step", 1);
  c.mlp_only_layers = f.int_list("mlp_only_layers");
  parse_rope(f, c, 10000.0);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-6);
  c.router_aux_loss_coef = f.get_double("router_aux_loss_coef", 0.001);
  c.qkv_bias = f.get_bool("qkv_bias", true);
  c.use_sliding_window = f.get_bool("use_sliding_window", false);
  // transformers writes sliding_window 0 when use_sliding_window is false.
  c.sliding_window = f.opt_int("sliding_window");
  if (c.sliding_window == 0) c.sliding_window.reset();
  c.max_window_layers = f.opt_int("max_window_layers");
  for (const std::string& kind : f.string_list("layer_types")) {
    if (kind != "full_attention") {
      f.fail(str_of("config field 'layer_types' holds '", kind, "'"),
             "TierMoE implements full causal attention only: every entry must be "
             "\"full_attention\" (and use_sliding_window false)");
    }
  }
  c.bos_token_id = token_id(f, "bos_token_id", std::nullopt);
  c.eos_token_id = f.int_or_int_list("eos_token_id");
  c.pad_token_id = token_id(f, "pad_token_id", std::nullopt);
}

// num_nextn_predict_layers (transformers 5: num_mtp_layers), default 1.
void parse_mtp_layers(const FieldReader& f, ModelConfig& c) {
  auto mtp = f.opt_int("num_nextn_predict_layers"), mtp_v5 = f.opt_int("num_mtp_layers");
  c.num_nextn_predict_layers = mtp ? *mtp : mtp_v5.value_or(1);
}

// The sigmoid router's shared experts: n_shared_experts of the expert width.
void parse_shared_experts(const FieldReader& f, ModelConfig& c) {
  const int64_t shared = f.get_int("n_shared_experts", 1);
  if (shared < 0) {
    f.fail(str_of("config field 'n_shared_experts' is ", shared), "use 0 or more shared experts");
  }
  c.shared_expert_intermediate_size = shared * c.moe_intermediate_size;
}

// Glm4MoeConfig: DeepSeek-V3's MoE (dense first layers, sigmoid group-limited
// routing, ungated shared experts) under GQA with q/k/v bias (attention_bias:
// o_proj has none), an optional per-head q/k norm and partial rotary RoPE.
void parse_glm4_moe(const FieldReader& f, ModelConfig& c) {
  c.vocab_size = f.get_int("vocab_size", 151552);
  c.hidden_size = f.get_int("hidden_size", 4096);
  c.intermediate_size = f.get_int("intermediate_size", 10944);
  c.moe_intermediate_size = f.get_int("moe_intermediate_size", 1408);
  c.num_hidden_layers = f.get_int("num_hidden_layers", 46);
  c.num_attention_heads = f.get_int("num_attention_heads", 96);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 131072);
  parse_common(f, c, 8);
  parse_head_dim(f, c, true);
  c.num_experts = expert_count(f, "n_routed_experts", "num_local_experts", 128);
  c.num_experts_per_tok = f.get_int("num_experts_per_tok", 8);
  parse_shared_experts(f, c);
  c.routed_scaling_factor = f.get_double("routed_scaling_factor", 1.0);
  c.n_group = f.get_int("n_group", 1);
  c.topk_group = f.get_int("topk_group", 1);
  c.first_k_dense_replace = f.get_int("first_k_dense_replace", 1);
  c.norm_topk_prob = f.get_bool("norm_topk_prob", true);
  c.use_qk_norm = f.get_bool("use_qk_norm", false);
  c.qkv_bias = f.get_bool("attention_bias", false);
  parse_rope(f, c, 10000.0);
  // transformers 4 keeps partial_rotary_factor at the top level, 5 in rope_parameters.
  c.partial_rotary_factor = f.get_double("partial_rotary_factor", 0.5);
  if (const Json* rope = f.object("rope_parameters")) {
    if (auto factor = FieldReader(*rope, "").opt_double("partial_rotary_factor")) {
      c.partial_rotary_factor = *factor;
    }
  }
  parse_mtp_layers(f, c);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-5);
  // transformers' DeepSeek-V3 family adds no load-balancing loss to its loss
  // whatever output_router_logits says, so neither does TierMoE.
  c.output_router_logits = false;
  c.bos_token_id = token_id(f, "bos_token_id", std::nullopt);
  c.eos_token_id = f.int_or_int_list("eos_token_id");
  c.pad_token_id = token_id(f, "pad_token_id", std::nullopt);
}

// GptOssConfig: every layer MoE (intermediate_size is the expert width),
// alternating sliding and full attention, q/k/v/o bias, YaRN RoPE by default.
void parse_gpt_oss(const FieldReader& f, ModelConfig& c) {
  c.vocab_size = f.get_int("vocab_size", 201088);
  c.hidden_size = f.get_int("hidden_size", 2880);
  c.moe_intermediate_size = f.get_int("intermediate_size", 2880);
  c.intermediate_size = c.moe_intermediate_size;
  c.num_hidden_layers = f.get_int("num_hidden_layers", 36);
  c.num_attention_heads = f.get_int("num_attention_heads", 64);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 131072);
  parse_common(f, c, 8);
  // GptOssConfig's head_dim defaults to 64 (not D / H: 2880 / 64 is 45); null means D / H.
  if (f.present("head_dim"))
    parse_head_dim(f, c, true);
  else
    c.head_dim = 64;
  c.num_experts = expert_count(f, "num_local_experts", "num_experts", 128);
  c.num_experts_per_tok = f.get_int("num_experts_per_tok", 4);
  c.norm_topk_prob = false;  // the router softmaxes over the K chosen logits
  if (!f.has("rope_scaling") && !f.has("rope_parameters")) {
    // GptOssConfig's default: YaRN, factor 32 over 4096 positions, no truncation.
    c.rope_scaling.kind = RopeScaling::Kind::yarn;
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.original_max_position_embeddings = 4096;
    c.rope_scaling.truncate = false;
  }
  parse_rope(f, c, 150000.0);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-5);
  c.router_aux_loss_coef = f.get_double("router_aux_loss_coef", 0.001);
  c.attention_bias = f.get_bool("attention_bias", true);
  c.sliding_window = f.present("sliding_window") ? f.opt_int("sliding_window") : 128;
  c.layer_types = f.string_list("layer_types");
  if (!f.has("layer_types")) {  // transformers: sliding on even layers, full on odd ones
    for (int64_t l = 0; l < std::min(c.num_hidden_layers, ModelConfig::kMaxLayers); ++l) {
      c.layer_types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
    }
  }
  for (const char* key : {"swiglu_alpha", "swiglu_limit"}) {
    if (f.present(key) && !f.has(key)) {  // transformers would multiply by None
      f.fail(str_of("config field '", key, "' is null"),
             "give it a number, or leave it out for GptOssConfig's default");
    }
  }
  c.swiglu_alpha = f.get_double("swiglu_alpha", 1.702);
  c.swiglu_limit = f.get_double("swiglu_limit", 7.0);
  c.bos_token_id = token_id(f, "bos_token_id", std::nullopt);
  c.eos_token_id = f.int_or_int_list("eos_token_id");
  c.pad_token_id = token_id(f, "pad_token_id", std::nullopt);
}

// A value of a field DeepSeek's own configuration code reads (transformers
// ignores it) that must be the one TierMoE implements.
void require_string(const FieldReader& f, const char* key, const char* want) {
  auto v = f.opt_string(key);
  if (v && *v != want) {
    f.fail(str_of("config field '", key, "' is '", *v, "'"),
           str_of("DeepSeek-V3's architecture routes with ", key, " \"", want, "\""));
  }
}

// DeepseekV3Config (and Kimi-K2's): GLM-4.5's MoE (dense first layers,
// sigmoid group-limited routing, ungated shared experts) under multi-head
// latent attention, with interleaved rope dims and YaRN's mscale on the
// softmax scale.
void parse_deepseek_v3(const FieldReader& f, ModelConfig& c) {
  c.vocab_size = f.get_int("vocab_size", 129280);
  c.hidden_size = f.get_int("hidden_size", 7168);
  c.intermediate_size = f.get_int("intermediate_size", 18432);
  c.moe_intermediate_size = f.get_int("moe_intermediate_size", 2048);
  c.num_hidden_layers = f.get_int("num_hidden_layers", 61);
  c.num_attention_heads = f.get_int("num_attention_heads", 128);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 4096);
  parse_common(f, c, 128);
  // MLA expands k and v for every head; DeepseekV3Attention never reads the field.
  c.num_key_value_heads = c.num_attention_heads;
  c.q_lora_rank = f.present("q_lora_rank") ? f.opt_int("q_lora_rank").value_or(0) : 1536;
  c.kv_lora_rank = f.get_int("kv_lora_rank", 512);
  c.qk_nope_head_dim = f.get_int("qk_nope_head_dim", 128);
  c.qk_rope_head_dim = f.get_int("qk_rope_head_dim", 64);
  c.v_head_dim = f.get_int("v_head_dim", 128);
  c.head_dim = c.qk_rope_head_dim;  // as DeepseekV3Config sets it, whatever config.json says
  c.rope_interleave = f.get_bool("rope_interleave", true);
  c.attention_bias = f.get_bool("attention_bias", false);
  c.num_experts = expert_count(f, "n_routed_experts", "num_local_experts", 256);
  c.num_experts_per_tok = f.get_int("num_experts_per_tok", 8);
  parse_shared_experts(f, c);
  c.routed_scaling_factor = f.get_double("routed_scaling_factor", 2.5);
  c.n_group = f.get_int("n_group", 8);
  c.topk_group = f.get_int("topk_group", 4);
  c.first_k_dense_replace = f.get_int("first_k_dense_replace", 3);
  c.norm_topk_prob = f.get_bool("norm_topk_prob", true);
  require_string(f, "topk_method", "noaux_tc");
  require_string(f, "scoring_func", "sigmoid");
  if (f.get_int("moe_layer_freq", 1) != 1) {
    f.fail(str_of("config field 'moe_layer_freq' is ", f.get_int("moe_layer_freq", 1)),
           "DeepSeek-V3's architecture makes every layer from first_k_dense_replace on MoE: "
           "set moe_layer_freq to 1");
  }
  parse_rope(f, c, 10000.0);
  parse_mtp_layers(f, c);
  c.rms_norm_eps = f.get_double("rms_norm_eps", 1e-6);
  c.output_router_logits = false;  // no load-balancing loss, as for GLM-4.5
  c.bos_token_id = token_id(f, "bos_token_id", 0);
  c.eos_token_id =
      f.present("eos_token_id") ? f.int_or_int_list("eos_token_id") : std::vector<int64_t>{1};
  c.pad_token_id = token_id(f, "pad_token_id", std::nullopt);
}

}  // namespace

ModelConfig parse_model_config(std::string_view json_text, const std::string& path) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw Error(str_of("invalid JSON: ", e.what()), path,
                "config.json must be one JSON object as transformers writes it");
  }
  TIERMOE_CHECK(j.is_object(), str_of("config.json holds ", j.type_name(), ", not an object"), path,
                "config.json must be one JSON object");
  FieldReader f(j, path);
  auto type = f.opt_string("model_type");
  TIERMOE_CHECK(type.has_value(), "config.json has no model_type", path,
                str_of("add \"model_type\": one of ", kSupportedTypes));
  ModelConfig c;
  c.model_type = *type;
  c.family = parse_family(*type, path);
  switch (c.family) {
    case ModelFamily::qwen3_moe: parse_qwen3_moe(f, c); break;
    case ModelFamily::mixtral: parse_mixtral(f, c); break;
    case ModelFamily::olmoe: parse_olmoe(f, c); break;
    case ModelFamily::qwen2_moe: parse_qwen2_moe(f, c); break;
    case ModelFamily::glm4_moe: parse_glm4_moe(f, c); break;
    case ModelFamily::gpt_oss: parse_gpt_oss(f, c); break;
    case ModelFamily::deepseek_v3: parse_deepseek_v3(f, c); break;
  }
  if (const Json* q = f.object("quantization_config")) parse_quantization_config(*q, path, c);
  c.validate(path);
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  require_regular_file(p.string(), "config.json",
                       "a checkpoint directory holds config.json next to its safetensors files");
  // Real configs are a few KB; a huge file is refused before it is read.
  constexpr uintmax_t kMaxConfigBytes = uintmax_t(16) << 20;
  const uintmax_t size = std::filesystem::file_size(p);
  TIERMOE_CHECK(
      size <= kMaxConfigBytes,
      str_of("config.json is ", size, " bytes, above the ", kMaxConfigBytes, " TierMoE reads"),
      p.string(), "a model's config.json is a few KB: is this the right file?");
  std::ifstream in(p, std::ios::binary);
  TIERMOE_CHECK(in.good(), "cannot open config.json", p.string(),
                "a checkpoint directory holds config.json next to its safetensors files");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), p.string());
}

}  // namespace tiermoe
