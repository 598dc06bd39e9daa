#pragma once
// A family's config.json fields, declared once and used both ways: reading
// (strictly, transformers' class defaults for what is absent) and writing
// (the config.json transformers loads as-is). A family's `fields` function
// visits its ModelConfig members through ConfigIo; ConfigReader fills them
// from JSON, ConfigWriter copies them out. Derived values (Mixtral's expert
// width under intermediate_size, n_shared_experts as a width) are computed
// in the family's function from the members, so both directions agree.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tiermoe/io/family.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe::families {

using Json = nlohmann::json;

// Reads typed fields of one JSON object, naming the file and field on error.
// A JSON null counts as absent, as it does for transformers' optional fields.
class FieldReader {
 public:
  FieldReader(const Json& j, const std::string& path) : j_(j), path_(path) {}

  bool present(const char* key) const { return j_.contains(key); }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  std::optional<int64_t> opt_int(const char* key) const;
  std::optional<double> opt_double(const char* key) const;
  std::optional<bool> opt_bool(const char* key) const;
  std::optional<std::string> opt_string(const char* key) const;
  std::vector<int64_t> int_list(const char* key) const;
  std::vector<std::string> string_list(const char* key) const;
  const Json* object(const char* key) const;
  const Json& raw(const char* key) const { return j_.at(key); }

  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& what, const std::string& hint) const;

 private:
  [[noreturn]] void type_error(const char* key, const char* want, const Json& got) const;

  const Json& j_;
  const std::string& path_;
};

// How a family writes head_dim (every family reads it when present, else D / H).
enum class HeadDimField : uint8_t {
  always,       // written always
  when_uneven,  // written when it is not D / H (Qwen2MoeConfig has no such field)
  never,        // OlmoeConfig and DeepseekV3Config derive it
};

class ConfigIo {
 public:
  virtual ~ConfigIo() = default;
  // The reader, or null when writing: for checks only reading can make.
  virtual const FieldReader* reader() const = 0;

  // Absent (or null) reads as `dflt`.
  virtual void field(const char* key, int64_t& v, int64_t dflt) = 0;
  virtual void field(const char* key, double& v, double dflt) = 0;
  virtual void field(const char* key, bool& v, bool dflt) = 0;
  virtual void field(const char* key, std::string& v, const char* dflt) = 0;
  // Absent reads as `dflt`, null as none (transformers' optional fields).
  virtual void field(const char* key, std::optional<int64_t>& v, std::optional<int64_t> dflt) = 0;
  virtual void field(const char* key, std::optional<double>& v) = 0;
  // A list; absent reads as empty.
  virtual void field(const char* key, std::vector<int64_t>& v) = 0;
  virtual void field(const char* key, std::vector<std::string>& v) = 0;
  // One id or a list of ids (eos_token_id); absent reads as `dflt`, null as none.
  virtual void ids(const char* key, std::vector<int64_t>& v, std::vector<int64_t> dflt) = 0;
  // A count under `key` or transformers 5's `alias` (both present must agree).
  virtual void aliased(const char* key, const char* alias, int64_t& v, int64_t dflt) = 0;
  // A value TierMoE implements only as transformers' default: read, it must be
  // absent, null or `value`; written as `value`.
  virtual void fixed(const char* key, const Json& value, const char* hint) = 0;
  // rope_theta and rope_scaling (v4) or rope_parameters (v5); `absent` is
  // the scaling when config.json gives neither (gpt-oss: YaRN).
  virtual void rope(ModelConfig& c, double theta, const RopeScaling& absent) = 0;
  // A RoPE field v4 keeps at the top level and v5 in rope_parameters.
  virtual void rope_field(const char* key, double& v, double dflt) = 0;
  // num_key_value_heads: absent is `dflt` (none: one per query head), null one per query head.
  virtual void kv_heads(ModelConfig& c, std::optional<int64_t> dflt) = 0;
  virtual void head_dim(ModelConfig& c, HeadDimField written) = 0;
};

// transformers' class defaults of the fields every family has.
struct CommonDefaults {
  int64_t vocab_size, hidden_size, num_hidden_layers, num_attention_heads;
  std::optional<int64_t> num_key_value_heads;  // none: one per query head
  int64_t num_experts_per_tok, max_position_embeddings;
  double rope_theta, rms_norm_eps, router_aux_loss_coef = 0.001;
  std::optional<int64_t> bos_token_id, pad_token_id;
  std::vector<int64_t> eos_token_id;
  RopeScaling rope_scaling = {};
};
// An Error naming config field `field` unless v > 0.
void require_positive(const char* field, int64_t v, const std::string& where);
// The fields every family shares, read or written.
void common_fields(ConfigIo& io, ModelConfig& c, const CommonDefaults& d);
// n_shared_experts (GLM-4.5, DeepSeek-V2/V3): shared experts of the expert width.
void shared_experts_field(ConfigIo& io, ModelConfig& c, int64_t dflt);
// The sigmoid router's fields (GLM-4.5, DeepSeek-V3, GLM-4.7-Flash), with
// their class defaults, and the shared experts beside it.
struct SigmoidRouterDefaults {
  int64_t n_routed_experts, n_group, topk_group;
  double routed_scaling_factor;
};
void sigmoid_router_fields(ConfigIo& io, ModelConfig& c, const SigmoidRouterDefaults& d);
// The first layers dense, the rest MoE, and the multi-token-prediction
// layers past them skipped on load (GLM-4.5, DeepSeek-V3).
void dense_first_fields(ConfigIo& io, ModelConfig& c, int64_t first_k_dense_replace);
// Multi-head latent attention's fields (DeepSeek-V3, GLM-4.7-Flash), with the
// class defaults that differ (kv_lora_rank 512 and qk_rope_head_dim 64 are
// every class's), and its invariants.
struct MlaDefaults {
  std::optional<int64_t> q_lora_rank;
  int64_t qk_nope_head_dim, v_head_dim;
  // Whether config.json says rope_interleave (DeepSeek-V3's classes); without
  // it the rope dims are always pairs (DeepSeek-V2's complex rotation).
  bool interleave_field = true;
};
void mla_fields(ConfigIo& io, ModelConfig& c, const MlaDefaults& d);
void validate_mla(const ModelConfig& c, const std::string& where);

struct FamilyDef {
  FamilySpec spec;
  void (*fields)(ConfigIo& io, ModelConfig& c);
  // The family's own invariants, after the common ones (model_config.cpp).
  void (*validate)(const ModelConfig& c, const std::string& where) = nullptr;
};

const FamilyDef& qwen3_moe();
const FamilyDef& mixtral();
const FamilyDef& olmoe();
const FamilyDef& qwen2_moe();
const FamilyDef& glm4_moe();
const FamilyDef& gpt_oss();
const FamilyDef& deepseek_v3();
const FamilyDef& glm4_moe_lite();
const FamilyDef& deepseek_v2();
const FamilyDef& minimax_m2();
const FamilyDef& qwen3_5_moe();

const FamilyDef& family_def(ModelFamily family);
// The family whose model_type or alias is `model_type`; null when none.
const FamilyDef* find_family(std::string_view model_type);
// The family whose multimodal releases have `model_type`; null when none.
const FamilyDef* find_multimodal_family(std::string_view model_type);

// Reads `j` (config.json) into `c` by its family's table; writes `c` into `j`.
void read_config(const FamilyDef& family, const Json& j, const std::string& path, ModelConfig& c);
Json write_config(const FamilyDef& family, const ModelConfig& c);

}  // namespace tiermoe::families
