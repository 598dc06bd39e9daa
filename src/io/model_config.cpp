#include "tiermoe/io/model_config.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"

namespace tiermoe {

namespace {

using Json = nlohmann::json;
using detail::str_of;

constexpr std::string_view kSupportedTypes = "qwen3_moe, qwen2_moe, mixtral, olmoe";
// The release that introduced Qwen3-MoE; every field written here exists there.
constexpr const char* kTransformersVersion = "4.51.0";

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
  double get_double(const char* key, double dflt) const {
    return opt_double(key).value_or(dflt);
  }

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
  throw Error(str_of("unsupported model_type '", type, "'"), path,
              str_of("TierMoE supports model_type ", kSupportedTypes));
}

// RoPE: v4 keeps rope_theta at the top level and scaling in rope_scaling; v5
// moves both into rope_parameters. Only plain RoPE is implemented.
void parse_rope(const FieldReader& f, ModelConfig& c, double default_theta) {
  c.rope_theta = f.get_double("rope_theta", default_theta);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const Json* rope = f.object(key);
    if (!rope) continue;
    FieldReader r(*rope, "");
    std::string type = r.opt_string("rope_type").value_or(r.opt_string("type").value_or("default"));
    if (type != "default") {
      f.fail(str_of("config field '", key, "' asks for RoPE type '", type, "'"),
             "TierMoE implements plain RoPE only; set the field to null");
    }
    if (auto theta = r.opt_double("rope_theta")) c.rope_theta = *theta;
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
  auto e = f.opt_int("num_experts"), e_v5 = f.opt_int("num_local_experts");
  if (e && e_v5 && *e != *e_v5) {
    f.fail(str_of("num_experts (", *e, ") and num_local_experts (", *e_v5, ") disagree"),
           "keep one of the two fields");
  }
  c.num_experts = e ? *e : e_v5.value_or(128);
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
  c.eos_token_id = f.present("eos_token_id") ? f.int_or_int_list("eos_token_id")
                                              : std::vector<int64_t>{2};
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
  c.eos_token_id = f.present("eos_token_id") ? f.int_or_int_list("eos_token_id")
                                              : std::vector<int64_t>{50279};
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

}  // namespace
std::string_view torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "float64";
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
  }
  __builtin_unreachable();
}

std::string_view family_name(ModelFamily family) {
  switch (family) {
    case ModelFamily::qwen3_moe: return "qwen3_moe";
    case ModelFamily::mixtral: return "mixtral";
    case ModelFamily::olmoe: return "olmoe";
    case ModelFamily::qwen2_moe:
      return "qwen2_moe";
  }
  __builtin_unreachable();
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) {
    return false;
  }
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::num_moe_layers() const {
  if (num_experts <= 0 || decoder_sparse_step <= 0 || num_hidden_layers <= 0) return 0;
  // Counted without visiting every layer: a config may claim 2^63 of them.
  int64_t n = num_hidden_layers / decoder_sparse_step;
  std::vector<int64_t> dense = mlp_only_layers;
  std::sort(dense.begin(), dense.end());
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  for (int64_t l : dense) {
    if (l >= 0 && l < num_hidden_layers && (l + 1) % decoder_sparse_step == 0) --n;
  }
  return n;
}

QkNorm ModelConfig::qk_norm() const {
  switch (family) {
    case ModelFamily::qwen3_moe: return QkNorm::per_head;
    case ModelFamily::mixtral: return QkNorm::none;
    case ModelFamily::olmoe: return QkNorm::whole;
    case ModelFamily::qwen2_moe:
      return QkNorm::none;
  }
  __builtin_unreachable();
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
    TIERMOE_CHECK(v > 0, str_of("config field '", field, "' must be positive, got ", v), where,
                  "fix the value in config.json");
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  const bool moe_width_field = family == ModelFamily::qwen3_moe || family == ModelFamily::qwen2_moe;
  positive(moe_width_field ? "moe_intermediate_size" : "intermediate_size", moe_intermediate_size);
  TIERMOE_CHECK(family != ModelFamily::qwen2_moe || shared_expert_intermediate_size > 0,
                str_of("config field 'shared_expert_intermediate_size' must be positive, got ",
                       shared_expert_intermediate_size),
                where, "Qwen2-MoE runs a shared expert of that width in every MoE layer");
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive(family == ModelFamily::mixtral ? "num_local_experts" : "num_experts", num_experts);
  positive("num_experts_per_tok", num_experts_per_tok);
  positive("decoder_sparse_step", decoder_sparse_step);
  positive("max_position_embeddings", max_position_embeddings);
  TIERMOE_CHECK(vocab_size <= kMaxVocab,
                str_of("config field 'vocab_size' is ", vocab_size, ", more than the 2^31 ids ",
                       "TierMoE's 32-bit token ids can name"),
                where, "published vocabularies have under a million tokens; fix the value");
  // Bounded before anything loops over layers or lists per-expert tensors.
  const char* experts_field = family == ModelFamily::mixtral ? "num_local_experts" : "num_experts";
  TIERMOE_CHECK(num_hidden_layers <= kMaxLayers,
                str_of("config field 'num_hidden_layers' is ", num_hidden_layers,
                       ", more than the ", kMaxLayers, " layers TierMoE accepts"),
                where, "published models have at most a few hundred layers; fix the value");
  TIERMOE_CHECK(num_experts <= kMaxExperts,
                str_of("config field '", experts_field, "' is ", num_experts, ", more than the ",
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
  TIERMOE_CHECK(family != ModelFamily::mixtral || !sliding_window,
                str_of("Mixtral sliding_window is ", sliding_window.value_or(0)), where,
                "TierMoE implements full causal attention only; set sliding_window to null");
  TIERMOE_CHECK(family != ModelFamily::olmoe || head_dim * num_attention_heads == hidden_size,
                str_of("OLMoE head_dim ", head_dim, " times ", num_attention_heads,
                       " heads is not hidden_size ", hidden_size),
                where, "OLMoE splits hidden_size evenly among the heads");
  TIERMOE_CHECK(!moe_width_field || intermediate_size > 0 || num_moe_layers() == num_hidden_layers,
                "intermediate_size must be positive when some layers are dense", where, "");
  param_counts(*this, where);  // throws when a count overflows 64 bits
}

ModelConfig parse_model_config(std::string_view json_text, const std::string& path) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    throw Error(str_of("invalid JSON: ", e.what()), path,
                "config.json must be one JSON object as transformers writes it");
  }
  TIERMOE_CHECK(j.is_object(), str_of("config.json holds ", j.type_name(), ", not an object"),
                path, "config.json must be one JSON object");
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
    case ModelFamily::qwen2_moe:
      parse_qwen2_moe(f, c);
      break;
  }
  c.validate(path);
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  require_regular_file(p.string(), "config.json",
                       "a checkpoint directory holds config.json next to its safetensors files");
  std::ifstream in(p, std::ios::binary);
  TIERMOE_CHECK(in.good(), "cannot open config.json", p.string(),
                "a checkpoint directory holds config.json next to its safetensors files");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), p.string());
}

std::string ModelConfig::to_json() const {
  Json j;
  auto opt = [](const auto& v) -> Json { return v ? Json(*v) : Json(nullptr); };
  j["model_type"] = std::string(family_name(family));
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["rms_norm_eps"] = rms_norm_eps;
  j["router_aux_loss_coef"] = router_aux_loss_coef;
  j["output_router_logits"] = output_router_logits;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["max_position_embeddings"] = max_position_embeddings;
  j["hidden_act"] = hidden_act;
  j["initializer_range"] = initializer_range;
  j["attention_dropout"] = attention_dropout;
  j["torch_dtype"] = torch_dtype;
  j["transformers_version"] = kTransformersVersion;
  j["use_cache"] = true;
  j["bos_token_id"] = opt(bos_token_id);
  if (eos_token_id.size() == 1) j["eos_token_id"] = eos_token_id[0];
  else if (eos_token_id.empty()) j["eos_token_id"] = nullptr;
  else j["eos_token_id"] = eos_token_id;
  j["pad_token_id"] = opt(pad_token_id);
  switch (family) {
    case ModelFamily::qwen3_moe:
      j["architectures"] = {"Qwen3MoeForCausalLM"};
      j["intermediate_size"] = intermediate_size;
      j["moe_intermediate_size"] = moe_intermediate_size;
      j["head_dim"] = head_dim;
      j["num_experts"] = num_experts;
      j["norm_topk_prob"] = norm_topk_prob;
      j["decoder_sparse_step"] = decoder_sparse_step;
      j["mlp_only_layers"] = mlp_only_layers;
      j["attention_bias"] = attention_bias;
      j["use_sliding_window"] = use_sliding_window;
      j["sliding_window"] = opt(sliding_window);
      j["max_window_layers"] = max_window_layers.value_or(num_hidden_layers);
      break;
    case ModelFamily::mixtral:
      j["architectures"] = {"MixtralForCausalLM"};
      j["intermediate_size"] = moe_intermediate_size;
      j["head_dim"] = head_dim;
      j["num_local_experts"] = num_experts;
      j["sliding_window"] = nullptr;
      j["router_jitter_noise"] = 0.0;
      break;
    case ModelFamily::olmoe:
      j["architectures"] = {"OlmoeForCausalLM"};
      j["intermediate_size"] = moe_intermediate_size;
      j["num_experts"] = num_experts;
      j["norm_topk_prob"] = norm_topk_prob;
      j["attention_bias"] = attention_bias;
      j["clip_qkv"] = opt(clip_qkv);
      break;
    case ModelFamily::qwen2_moe:
      j["architectures"] = {"Qwen2MoeForCausalLM"};
      j["intermediate_size"] = intermediate_size;
      j["moe_intermediate_size"] = moe_intermediate_size;
      j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
      j["num_experts"] = num_experts;
      j["norm_topk_prob"] = norm_topk_prob;
      j["decoder_sparse_step"] = decoder_sparse_step;
      j["mlp_only_layers"] = mlp_only_layers;
      j["qkv_bias"] = qkv_bias;
      j["use_sliding_window"] = false;
      j["sliding_window"] = opt(sliding_window);
      j["max_window_layers"] = max_window_layers.value_or(num_hidden_layers);
      // head_dim only when it is not D / H (Qwen2MoeConfig has no such field).
      if (head_dim * num_attention_heads != hidden_size) j["head_dim"] = head_dim;
      break;
  }
  return j.dump(2) + "\n";
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

  int64_t attention = add({mul({D, H, P}), mul({2, D, Hkv, P}), mul({H, P, D})});  // q, k, v, o
  if (c.q_k_v_bias()) attention = add({attention, mul({H, P}), mul({2, Hkv, P})});
  if (c.attention_bias) attention = add({attention, D});
  switch (c.qk_norm()) {
    case QkNorm::none: break;
    case QkNorm::per_head: attention = add({attention, mul({2, P})}); break;
    case QkNorm::whole: attention = add({attention, mul({H, P}), mul({Hkv, P})}); break;
  }
  const int64_t per_layer = add({attention, mul({2, D})});  // plus input and post-attention norms
  const int64_t moe_layers = c.num_moe_layers();
  const int64_t dense_layers = c.num_hidden_layers - moe_layers;

  n.experts = mul({moe_layers, E, n.per_expert});
  // A gated shared expert: its gate, up and down projections and its [1, D] gate.
  const int64_t shared =
      c.has_shared_expert() ? add({mul({3, D, c.shared_expert_intermediate_size}), D}) : 0;
  n.total =
      add({n.embedding, D, c.tie_word_embeddings ? 0 : n.embedding,
           mul({c.num_hidden_layers, per_layer}), mul({moe_layers, E, D}) /* routers */, n.experts,
           mul({moe_layers, shared}), mul({dense_layers, 3, D, c.intermediate_size})});
  n.active_per_token = n.total - mul({moe_layers, std::max<int64_t>(E - K, 0), n.per_expert});
  return n;
}

}  // namespace tiermoe
