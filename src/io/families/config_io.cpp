// ConfigIo's two directions and the fields every family shares.
#include "config_io.h"

#include "tiermoe/core/error.h"

namespace tiermoe::families {

using detail::str_of;

std::optional<int64_t> FieldReader::opt_int(const char* key) const {
  if (!has(key)) return std::nullopt;
  const Json& v = j_.at(key);
  if (!v.is_number_integer()) type_error(key, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) {
    type_error(key, "an integer below 2^63", v);
  }
  return v.get<int64_t>();
}

std::optional<double> FieldReader::opt_double(const char* key) const {
  if (!has(key)) return std::nullopt;
  const Json& v = j_.at(key);
  if (!v.is_number()) type_error(key, "a number", v);
  return v.get<double>();
}

std::optional<bool> FieldReader::opt_bool(const char* key) const {
  if (!has(key)) return std::nullopt;
  const Json& v = j_.at(key);
  if (!v.is_boolean()) type_error(key, "true or false", v);
  return v.get<bool>();
}

std::optional<std::string> FieldReader::opt_string(const char* key) const {
  if (!has(key)) return std::nullopt;
  const Json& v = j_.at(key);
  if (!v.is_string()) type_error(key, "a string", v);
  return v.get<std::string>();
}

std::vector<int64_t> FieldReader::int_list(const char* key) const {
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

std::vector<std::string> FieldReader::string_list(const char* key) const {
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

const Json* FieldReader::object(const char* key) const {
  if (!has(key)) return nullptr;
  const Json& v = j_.at(key);
  if (!v.is_object()) type_error(key, "an object", v);
  return &v;
}

void FieldReader::fail(const std::string& what, const std::string& hint) const {
  throw Error(what, path_, hint);
}

void FieldReader::type_error(const char* key, const char* want, const Json& got) const {
  fail(
      str_of("config field '", key, "' must be ", want, ", got ", got.type_name(), " ", got.dump()),
      "fix the value in config.json (transformers writes it with that JSON type)");
}

namespace {

class ConfigReader final : public ConfigIo {
 public:
  explicit ConfigReader(const FieldReader& f) : f_(f) {}

  const FieldReader* reader() const override { return &f_; }

  void field(const char* key, int64_t& v, int64_t dflt) override {
    v = f_.opt_int(key).value_or(dflt);
  }
  void field(const char* key, double& v, double dflt) override {
    v = f_.opt_double(key).value_or(dflt);
  }
  void field(const char* key, bool& v, bool dflt) override { v = f_.opt_bool(key).value_or(dflt); }
  void field(const char* key, std::string& v, const char* dflt) override {
    v = f_.opt_string(key).value_or(dflt);
  }
  void field(const char* key, std::optional<int64_t>& v, std::optional<int64_t> dflt) override {
    v = f_.present(key) ? f_.opt_int(key) : dflt;
  }
  void field(const char* key, std::optional<double>& v) override { v = f_.opt_double(key); }
  void field(const char* key, std::vector<int64_t>& v) override { v = f_.int_list(key); }
  void field(const char* key, std::vector<std::string>& v) override { v = f_.string_list(key); }

  void ids(const char* key, std::vector<int64_t>& v, std::vector<int64_t> dflt) override {
    if (!f_.present(key)) {
      v = std::move(dflt);
    } else if (f_.has(key) && f_.raw(key).is_number_integer()) {
      v = {*f_.opt_int(key)};
    } else {
      v = f_.int_list(key);
    }
  }

  void aliased(const char* key, const char* alias, int64_t& v, int64_t dflt) override {
    auto a = f_.opt_int(key), b = f_.opt_int(alias);
    if (a && b && *a != *b) {
      f_.fail(str_of(key, " (", *a, ") and ", alias, " (", *b, ") disagree"),
              "keep one of the two fields");
    }
    v = a ? *a : b.value_or(dflt);
  }

  void fixed(const char* key, const Json& value, const char* hint) override {
    if (f_.has(key) &&
        !(value.is_number() ? f_.opt_double(key) == value.get<double>() : f_.raw(key) == value)) {
      f_.fail(str_of("config field '", key, "' is ", f_.raw(key).dump()), hint);
    }
  }

  void rope(ModelConfig& c, double theta, const RopeScaling& absent) override;

  void rope_field(const char* key, double& v, double dflt) override {
    v = f_.opt_double(key).value_or(dflt);
    if (const Json* rope = f_.object("rope_parameters")) {
      if (auto inner = FieldReader(*rope, f_.path()).opt_double(key)) v = *inner;
    }
  }

  void kv_heads(ModelConfig& c, std::optional<int64_t> dflt) override {
    const char* key = "num_key_value_heads";
    c.num_key_value_heads = f_.has(key)                ? *f_.opt_int(key)
                            : !f_.present(key) && dflt ? *dflt
                                                       : c.num_attention_heads;
  }

  void head_dim(ModelConfig& c, HeadDimField written) override {
    if (written != HeadDimField::never && f_.has("head_dim")) {
      c.head_dim = *f_.opt_int("head_dim");
      return;
    }
    if (c.num_attention_heads <= 0) return;  // validate() reports it
    if (c.hidden_size % c.num_attention_heads != 0) {
      f_.fail(str_of("hidden_size ", c.hidden_size, " is not divisible by num_attention_heads ",
                     c.num_attention_heads, " and head_dim is absent"),
              written != HeadDimField::never
                  ? "set head_dim explicitly, or make hidden_size a multiple of the heads"
                  : "this family has no head_dim field: hidden_size must be a multiple of "
                    "num_attention_heads");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

 private:
  const FieldReader& f_;
};

void ConfigReader::rope(ModelConfig& c, double theta, const RopeScaling& absent) {
  if (!f_.has("rope_scaling") && !f_.has("rope_parameters")) c.rope_scaling = absent;
  c.rope_theta = f_.opt_double("rope_theta").value_or(theta);
  RopeScaling& s = c.rope_scaling;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const Json* rope = f_.object(key);
    if (!rope) continue;
    FieldReader r(*rope, f_.path());
    std::string type = r.opt_string("rope_type").value_or(r.opt_string("type").value_or("default"));
    if (auto inner = r.opt_double("rope_theta")) c.rope_theta = *inner;
    if (type == "default") continue;
    if (type != "yarn") {
      f_.fail(str_of("config field '", key, "' asks for RoPE type '", type, "'"),
              "TierMoE implements plain RoPE and yarn; set the field to null for plain RoPE");
    }
    s.kind = RopeScaling::Kind::yarn;
    s.original_max_position_embeddings =
        r.opt_int("original_max_position_embeddings")
            .value_or(f_.opt_int("original_max_position_embeddings").value_or(0));
    // Absent, it is max_position_embeddings / original (below); 0 is not
    // "absent" but a value transformers' RoPE validation refuses.
    s.factor = 0.0;
    if (auto factor = r.opt_double("factor")) {
      if (!(*factor > 0)) {
        f_.fail(str_of("config field '", key, "' has yarn factor ", *factor),
                "YaRN's factor is positive; leave it out for max_position_embeddings / "
                "original_max_position_embeddings");
      }
      s.factor = *factor;
    }
    s.beta_fast = r.opt_double("beta_fast").value_or(32.0);
    s.beta_slow = r.opt_double("beta_slow").value_or(1.0);
    s.truncate = r.opt_bool("truncate").value_or(true);
    s.attention_factor = r.opt_double("attention_factor");
    s.mscale = r.opt_double("mscale");
    s.mscale_all_dim = r.opt_double("mscale_all_dim");
  }
  if (s.kind == RopeScaling::Kind::yarn) {
    if (s.original_max_position_embeddings == 0) {
      s.original_max_position_embeddings = c.max_position_embeddings;
    }
    if (s.factor == 0.0 && s.original_max_position_embeddings > 0) {
      s.factor = double(c.max_position_embeddings) / double(s.original_max_position_embeddings);
    }
  }
}

class ConfigWriter final : public ConfigIo {
 public:
  const FieldReader* reader() const override { return nullptr; }

  void field(const char* key, int64_t& v, int64_t) override { j[key] = v; }
  void field(const char* key, double& v, double) override { j[key] = v; }
  void field(const char* key, bool& v, bool) override { j[key] = v; }
  void field(const char* key, std::string& v, const char*) override { j[key] = v; }
  void field(const char* key, std::optional<int64_t>& v, std::optional<int64_t>) override {
    j[key] = v ? Json(*v) : Json(nullptr);
  }
  void field(const char* key, std::optional<double>& v) override {
    j[key] = v ? Json(*v) : Json(nullptr);
  }
  void field(const char* key, std::vector<int64_t>& v) override { j[key] = v; }
  void field(const char* key, std::vector<std::string>& v) override { j[key] = v; }
  void ids(const char* key, std::vector<int64_t>& v, std::vector<int64_t>) override {
    j[key] = v.size() == 1 ? Json(v[0]) : v.empty() ? Json(nullptr) : Json(v);
  }
  void aliased(const char* key, const char*, int64_t& v, int64_t) override { j[key] = v; }
  void fixed(const char* key, const Json& value, const char*) override { j[key] = value; }

  void rope(ModelConfig& c, double, const RopeScaling&) override {
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    const RopeScaling& s = c.rope_scaling;
    if (s.kind != RopeScaling::Kind::yarn) return;
    Json y = {{"rope_type", "yarn"},
              {"factor", s.factor},
              {"original_max_position_embeddings", s.original_max_position_embeddings},
              {"beta_fast", s.beta_fast},
              {"beta_slow", s.beta_slow},
              {"truncate", s.truncate}};
    if (s.attention_factor) y["attention_factor"] = *s.attention_factor;
    if (s.mscale) y["mscale"] = *s.mscale;
    if (s.mscale_all_dim) y["mscale_all_dim"] = *s.mscale_all_dim;
    j["rope_scaling"] = y;
  }
  void rope_field(const char* key, double& v, double) override { j[key] = v; }
  void kv_heads(ModelConfig& c, std::optional<int64_t>) override {
    j["num_key_value_heads"] = c.num_key_value_heads;
  }
  void head_dim(ModelConfig& c, HeadDimField written) override {
    const bool even = c.head_dim * c.num_attention_heads == c.hidden_size;
    if (written == HeadDimField::always || (written == HeadDimField::when_uneven && !even)) {
      j["head_dim"] = c.head_dim;
    }
  }

  Json j;
};

}  // namespace

void require_positive(const char* field, int64_t v, const std::string& where) {
  TIERMOE_CHECK(v > 0, str_of("config field '", field, "' must be positive, got ", v), where,
                "fix the value in config.json");
}

void common_fields(ConfigIo& io, ModelConfig& c, const CommonDefaults& d) {
  io.field("vocab_size", c.vocab_size, d.vocab_size);
  io.field("hidden_size", c.hidden_size, d.hidden_size);
  io.field("num_hidden_layers", c.num_hidden_layers, d.num_hidden_layers);
  io.field("num_attention_heads", c.num_attention_heads, d.num_attention_heads);
  io.kv_heads(c, d.num_key_value_heads);
  io.field("num_experts_per_tok", c.num_experts_per_tok, d.num_experts_per_tok);
  io.field("max_position_embeddings", c.max_position_embeddings, d.max_position_embeddings);
  io.rope(c, d.rope_theta, d.rope_scaling);  // after max_position_embeddings: YaRN reads it
  io.field("rms_norm_eps", c.rms_norm_eps, d.rms_norm_eps);
  io.field("router_aux_loss_coef", c.router_aux_loss_coef, d.router_aux_loss_coef);
  io.field("output_router_logits", c.output_router_logits, false);
  io.field("tie_word_embeddings", c.tie_word_embeddings, false);
  io.field("hidden_act", c.hidden_act, "silu");
  io.field("initializer_range", c.initializer_range, 0.02);
  io.field("attention_dropout", c.attention_dropout, 0.0);
  // Absent means float32, transformers' default; transformers 5 renamed it dtype.
  io.field("torch_dtype", c.torch_dtype, "float32");
  if (const FieldReader* r = io.reader()) {
    if (auto dtype = r->opt_string("dtype")) c.torch_dtype = *dtype;
  }
  io.field("bos_token_id", c.bos_token_id, d.bos_token_id);
  io.ids("eos_token_id", c.eos_token_id, d.eos_token_id);
  io.field("pad_token_id", c.pad_token_id, d.pad_token_id);
}

void shared_experts_field(ConfigIo& io, ModelConfig& c, int64_t dflt) {
  const int64_t F = c.moe_intermediate_size;
  int64_t shared = F > 0 ? c.shared_expert_intermediate_size / F : 0;
  io.field("n_shared_experts", shared, dflt);
  if (const FieldReader* r = io.reader(); r && shared < 0) {
    r->fail(str_of("config field 'n_shared_experts' is ", shared), "use 0 or more shared experts");
  }
  c.shared_expert_intermediate_size = shared * F;
}

void sigmoid_router_fields(ConfigIo& io, ModelConfig& c, const SigmoidRouterDefaults& d) {
  io.aliased("n_routed_experts", "num_local_experts", c.num_experts, d.n_routed_experts);
  shared_experts_field(io, c, 1);
  io.field("routed_scaling_factor", c.routed_scaling_factor, d.routed_scaling_factor);
  io.field("n_group", c.n_group, d.n_group);
  io.field("topk_group", c.topk_group, d.topk_group);
  io.field("norm_topk_prob", c.norm_topk_prob, true);
  // transformers' DeepSeek-V3 family adds no load-balancing loss to its loss
  // whatever output_router_logits says, so neither does TierMoE.
  c.output_router_logits = false;
}

void dense_first_fields(ConfigIo& io, ModelConfig& c, int64_t first_k_dense_replace) {
  io.field("first_k_dense_replace", c.first_k_dense_replace, first_k_dense_replace);
  io.aliased("num_nextn_predict_layers", "num_mtp_layers", c.num_nextn_predict_layers, 1);
}

void mla_fields(ConfigIo& io, ModelConfig& c, const MlaDefaults& d) {
  // MLA expands k and v for every head; the attention never reads the field.
  c.num_key_value_heads = c.num_attention_heads;
  io.field("attention_bias", c.attention_bias, false);
  // q_lora_rank null: q_proj straight from the hidden state (0 here).
  std::optional<int64_t> q_rank = c.q_lora_rank > 0 ? std::optional(c.q_lora_rank) : std::nullopt;
  io.field("q_lora_rank", q_rank, d.q_lora_rank);
  c.q_lora_rank = q_rank.value_or(0);
  io.field("kv_lora_rank", c.kv_lora_rank, 512);
  io.field("qk_nope_head_dim", c.qk_nope_head_dim, d.qk_nope_head_dim);
  io.field("qk_rope_head_dim", c.qk_rope_head_dim, 64);
  io.field("v_head_dim", c.v_head_dim, d.v_head_dim);
  c.head_dim = c.qk_rope_head_dim;  // as the config classes set it, whatever config.json says
  if (d.interleave_field) {
    io.field("rope_interleave", c.rope_interleave, true);
  } else {
    c.rope_interleave = true;
  }
}

void validate_mla(const ModelConfig& c, const std::string& where) {
  auto positive = [&](const char* field, int64_t v) { require_positive(field, v, where); };
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("qk_nope_head_dim", c.qk_nope_head_dim);
  positive("qk_rope_head_dim", c.qk_rope_head_dim);
  positive("v_head_dim", c.v_head_dim);
  TIERMOE_CHECK(c.q_lora_rank >= 0, str_of("config field 'q_lora_rank' is ", c.q_lora_rank), where,
                "a positive rank, or null for q_proj straight from the hidden state");
  TIERMOE_CHECK(c.head_dim == c.qk_rope_head_dim,
                str_of("head_dim ", c.head_dim, " is not qk_rope_head_dim ", c.qk_rope_head_dim),
                where, "under MLA head_dim is the rope width (transformers sets it so)");
  TIERMOE_CHECK(c.num_key_value_heads == c.num_attention_heads,
                str_of("num_key_value_heads ", c.num_key_value_heads, " with ",
                       c.num_attention_heads, " heads"),
                where,
                "multi-head latent attention expands k and v for every head: set "
                "num_key_value_heads to num_attention_heads (or null)");
}

void read_config(const FamilyDef& family, const Json& j, const std::string& path, ModelConfig& c) {
  FieldReader f(j, path);
  ConfigReader reader(f);
  family.fields(reader, c);
}

Json write_config(const FamilyDef& family, const ModelConfig& config) {
  ConfigWriter writer;
  ModelConfig c = config;  // the fields function sets derived members back on its copy
  family.fields(writer, c);
  writer.j["model_type"] = family.spec.model_type;
  writer.j["architectures"] = {family.spec.architecture};
  writer.j["transformers_version"] = family.spec.transformers_version;
  writer.j["use_cache"] = true;
  return writer.j;
}

}  // namespace tiermoe::families
