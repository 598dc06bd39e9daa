#include "tiermoe/io/peft.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "peft_fused.h"
#include "safetensors_common.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {

namespace {

using Json = nlohmann::json;
using detail::printable;
using detail::str_of;

constexpr const char* kSuffixA = ".lora_A.weight";
constexpr const char* kSuffixB = ".lora_B.weight";
constexpr uint64_t kMaxConfigBytes = 16u << 20;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// lora_alpha is an int in PEFT's dataclass; write whole numbers as integers
// so the file reads as PEFT's own.
Json number_json(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 9e15) return Json(int64_t(v));
  return Json(v);
}

void check_module_shapes(const std::string& path, const PeftLoraWeights& w, int64_t r,
                         const std::string& where) {
  const std::string a_key = kPeftKeyPrefix + path + kSuffixA;
  const std::string b_key = kPeftKeyPrefix + path + kSuffixB;
  TIERMOE_CHECK(w.A_RI.defined() && w.B_OR.defined(),
                "module " + printable(path) + " lacks " + (w.A_RI.defined() ? b_key : a_key), where,
                "every adapted module needs both lora_A and lora_B");
  TIERMOE_CHECK(w.A_RI.dim() == 2 && w.B_OR.dim() == 2,
                str_of(printable(a_key), " is ", w.A_RI.str(), " and ", printable(b_key), " is ",
                       w.B_OR.str(), "; both must be 2-D"),
                where, "lora_A is [r, in] and lora_B is [out, r]");
  TIERMOE_CHECK(w.A_RI.size(0) == w.B_OR.size(1),
                str_of("rank mismatch: ", printable(a_key), " is ", w.A_RI.str(), " but ",
                       printable(b_key), " is ", w.B_OR.str()),
                where, "lora_A's rows and lora_B's columns are both the rank r");
  TIERMOE_CHECK(w.A_RI.size(0) == r,
                str_of(printable(a_key), " has rank ", w.A_RI.size(0), " but r is ", r), where,
                "rank_pattern (per-module ranks) is not supported; all modules share r");
  TIERMOE_CHECK(w.A_RI.size(1) > 0 && w.B_OR.size(0) > 0,
                "module " + printable(path) + " has an empty dimension", where,
                "in and out features must be positive");
}

Json config_json(const PeftLoraConfig& c) {
  std::vector<std::string> targets = c.target_modules;
  std::sort(targets.begin(), targets.end());
  // Every field PEFT's LoraConfig.to_dict() writes, with PEFT's defaults for
  // those TierMoE does not use, so PEFT and vLLM read it as one of their own.
  Json j = Json::object();
  j["alpha_pattern"] = Json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = c.base_model_name_or_path;
  j["bias"] = "none";
  j["exclude_modules"] = nullptr;
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;  // PEFT's default patterns find model.layers.N
  j["layers_to_transform"] =
      c.layers_to_transform.empty() ? Json(nullptr) : Json(c.layers_to_transform);
  j["loftq_config"] = Json::object();
  j["lora_alpha"] = number_json(c.lora_alpha);
  j["lora_bias"] = false;
  j["lora_dropout"] = c.lora_dropout;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = c.r;
  j["rank_pattern"] = Json::object();
  j["revision"] = nullptr;
  j["target_modules"] = targets;
  j["task_type"] = c.task_type.empty() ? Json(nullptr) : Json(c.task_type);
  j["use_dora"] = false;
  j["use_rslora"] = c.use_rslora;
  return j;
}

// Typed reads of adapter_config.json; a JSON null counts as absent, as it
// does for PEFT's optional fields.
class ConfigReader {
 public:
  ConfigReader(const Json& j, const std::string& path) : j_(j), path_(path) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const Json& at(const char* key) const { return j_.at(key); }

  [[noreturn]] void fail(const char* key, const std::string& what, const std::string& hint) const {
    throw Error(what, path_ + " key " + key, hint);
  }
  void type_error(const char* key, const char* want) const {
    fail(key, str_of(key, " must be ", want, ", got ", printable(j_.at(key).dump())),
         "the adapter config is malformed");
  }

  std::string get_string(const char* key, const std::string& dflt) const {
    if (!has(key)) return dflt;
    if (!at(key).is_string()) type_error(key, "a string");
    return at(key).get<std::string>();
  }
  bool get_bool(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    if (!at(key).is_boolean()) type_error(key, "true or false");
    return at(key).get<bool>();
  }
  double get_number(const char* key, double dflt) const {
    if (!has(key)) return dflt;
    if (!at(key).is_number()) type_error(key, "a number");
    return at(key).get<double>();
  }
  // Fields TierMoE cannot honour must be absent, null or an empty container.
  bool empty_or_null(const char* key) const { return !has(key) || at(key).empty(); }

 private:
  const Json& j_;
  std::string path_;
};

PeftLoraConfig parse_config(const std::string& path, detail::PeftPatterns& patterns) {
  Json j = detail::parse_json_strict(detail::read_small_file(path, kMaxConfigBytes), 16, path,
                                     "adapter config");
  TIERMOE_CHECK(j.is_object(), "the adapter config is not a JSON object", path,
                "expected PEFT's adapter_config.json");
  ConfigReader f(j, path);

  std::string peft_type = f.get_string("peft_type", "");
  if (peft_type != "LORA") {
    f.fail("peft_type",
           "peft_type is " + (peft_type.empty() ? "missing" : printable(peft_type)) + ", not LORA",
           "TierMoE reads LoRA adapters only");
  }
  if (f.get_bool("use_dora", false)) {
    f.fail("use_dora", "DoRA adapters are not supported", "train a plain LoRA adapter");
  }
  std::string bias = f.get_string("bias", "none");
  if (bias != "none") {
    f.fail("bias", "bias is " + printable(bias) + ", not none",
           "adapters that train biases are not supported");
  }
  if (f.get_bool("lora_bias", false)) {
    f.fail("lora_bias", "lora_bias adapters are not supported", "use lora_bias false");
  }
  if (f.get_bool("fan_in_fan_out", false)) {
    f.fail("fan_in_fan_out", "fan_in_fan_out adapters (Conv1D weights) are not supported",
           "TierMoE models use nn.Linear [out, in] weights");
  }
  if (!f.empty_or_null("modules_to_save")) {
    f.fail("modules_to_save", "modules_to_save is " + printable(f.at("modules_to_save").dump()),
           "fully trained extra modules are not supported (vLLM rejects them too)");
  }
  if (f.has("use_qalora") && f.get_bool("use_qalora", false)) {
    f.fail("use_qalora", "QA-LoRA adapters are not supported", "train a plain LoRA adapter");
  }

  PeftLoraConfig c;
  if (!f.has("r") || !f.at("r").is_number_integer() || f.at("r").get<int64_t>() <= 0) {
    f.fail("r",
           "r must be a positive integer" +
               (f.has("r") ? ", got " + printable(f.at("r").dump()) : std::string(" (missing)")),
           "r is the LoRA rank");
  }
  c.r = f.at("r").get<int64_t>();
  c.lora_alpha = f.get_number("lora_alpha", 8);
  if (!std::isfinite(c.lora_alpha)) f.type_error("lora_alpha", "a finite number");
  c.lora_dropout = f.get_number("lora_dropout", 0.0);
  if (!(c.lora_dropout >= 0 && c.lora_dropout < 1)) f.type_error("lora_dropout", "in [0, 1)");
  c.use_rslora = f.get_bool("use_rslora", false);
  c.base_model_name_or_path = f.get_string("base_model_name_or_path", "");
  c.task_type = f.get_string("task_type", "");

  // layers_to_transform: an int or a list of them (PEFT's semantics: only
  // those decoder layers are adapted, matched under layers_pattern).
  if (f.has("layers_to_transform")) {
    const Json& l = f.at("layers_to_transform");
    const auto index = [&](const Json& v) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        f.type_error("layers_to_transform", "a layer index >= 0 or a list of them");
      }
      c.layers_to_transform.push_back(v.get<int64_t>());
    };
    if (l.is_array()) {
      for (const Json& v : l) index(v);
    } else {
      index(l);
    }
    std::sort(c.layers_to_transform.begin(), c.layers_to_transform.end());
    c.layers_to_transform.erase(
        std::unique(c.layers_to_transform.begin(), c.layers_to_transform.end()),
        c.layers_to_transform.end());
  }
  if (f.has("layers_pattern")) {
    const Json& lp = f.at("layers_pattern");
    const bool layers = (lp.is_string() && lp == "layers") ||
                        (lp.is_array() && lp.size() == 1 && lp[0] == "layers");
    if (!layers) {
      f.fail("layers_pattern", "layers_pattern " + printable(lp.dump()) + " is not supported",
             "TierMoE's decoder layers are model.layers.N: use \"layers\" or null");
    }
  }

  patterns = detail::parse_peft_patterns(j, path);
  if (!f.has("target_modules")) {
    if (!patterns.target_parameters.empty()) return c;
    f.fail("target_modules", "target_modules is missing", "list the adapted module names");
  }
  const Json& targets = f.at("target_modules");
  if (targets.is_string()) {
    f.fail("target_modules",
           "target_modules is a regular expression (" + printable(targets.get<std::string>()) + ")",
           "only a list of module names is supported, e.g. [\"q_proj\", \"v_proj\"]");
  }
  if (!targets.is_array()) f.type_error("target_modules", "a list of module names");
  // PEFT 0.21 for transformers 5 moves expert targets to target_parameters,
  // which may leave target_modules empty.
  for (const Json& t : targets) {
    if (!t.is_string() || t.get<std::string>().empty()) {
      f.type_error("target_modules", "a list of module names");
    }
    c.target_modules.push_back(t.get<std::string>());
  }
  std::sort(c.target_modules.begin(), c.target_modules.end());
  c.target_modules.erase(std::unique(c.target_modules.begin(), c.target_modules.end()),
                         c.target_modules.end());
  return c;
}

// PEFT's list matching: key == name or key ends with "." + name.
bool matches_targets(std::string_view path, const std::vector<std::string>& targets) {
  for (const std::string& t : targets) {
    if (path == t || ends_with(path, "." + t)) return true;
  }
  return false;
}

}  // namespace

void save_peft_adapter(const std::string& dir, const PeftLoraConfig& config,
                       const PeftLoraModules& modules, DType storage) {
  const std::string where = (std::filesystem::path(dir) / kPeftWeightsFile).string();
  TIERMOE_CHECK(config.r > 0, str_of("r must be positive, got ", config.r), where,
                "r is the LoRA rank");
  TIERMOE_CHECK(!config.target_modules.empty(), "target_modules is empty", where,
                "name the adapted modules, e.g. q_proj");
  TIERMOE_CHECK(!modules.empty(), "no modules to save", where,
                "an adapter needs at least one adapted module");
  NamedTensors tensors;
  tensors.reserve(2 * modules.size());
  for (const auto& [path, w] : modules) {
    TIERMOE_CHECK(!path.empty() && path.find(".lora_") == std::string::npos &&
                      path.rfind(kPeftKeyPrefix, 0) != 0,
                  "bad module path " + printable(path), where,
                  "pass the HF module path, e.g. model.layers.0.self_attn.q_proj");
    TIERMOE_CHECK(matches_targets(path, config.target_modules),
                  "module " + printable(path) + " matches no target_modules entry", where,
                  "add its name to target_modules");
    check_module_shapes(path, w, config.r, where);
    tensors.emplace_back(kPeftKeyPrefix + path + kSuffixA,
                         w.A_RI.dtype() == storage ? w.A_RI : w.A_RI.to(storage));
    tensors.emplace_back(kPeftKeyPrefix + path + kSuffixB,
                         w.B_OR.dtype() == storage ? w.B_OR : w.B_OR.to(storage));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TIERMOE_CHECK(!ec, "cannot create the adapter directory: " + ec.message(), dir,
                "check the path and permissions");
  save_safetensors(where, tensors);

  const std::string config_path = (std::filesystem::path(dir) / kPeftConfigFile).string();
  std::string text = config_json(config).dump(2) + "\n";
  AtomicFile out(config_path);
  out.write(text.data(), text.size());
  out.commit();
}

PeftAdapter load_peft_adapter(const std::string& dir) {
  const std::string config_path = (std::filesystem::path(dir) / kPeftConfigFile).string();
  const std::string weights_path = (std::filesystem::path(dir) / kPeftWeightsFile).string();
  TIERMOE_CHECK(std::filesystem::is_regular_file(config_path), "adapter config not found",
                config_path, "expected a PEFT adapter directory (adapter_config.json)");
  PeftAdapter adapter;
  detail::PeftPatterns patterns;
  adapter.config = parse_config(config_path, patterns);
  TIERMOE_CHECK(std::filesystem::is_regular_file(weights_path), "adapter weights not found",
                weights_path,
                "TierMoE reads adapter_model.safetensors only (not the legacy adapter_model.bin)");

  SafetensorsFile file = SafetensorsFile::open(weights_path);
  std::map<std::string, detail::FusedLora> fused;  // transformers-5 expert wrappers
  for (const SafetensorsEntry& e : file.entries()) {
    const std::string& key = e.name;
    bool is_a = ends_with(key, kSuffixA), is_b = ends_with(key, kSuffixB);
    TIERMOE_CHECK(key.rfind(kPeftKeyPrefix, 0) == 0 && (is_a || is_b),
                  "unexpected tensor " + printable(key), weights_path + " key " + printable(key),
                  "expected only base_model.model.<module>.lora_A.weight / lora_B.weight "
                  "(no biases, DoRA magnitudes, embeddings or adapter names)");
    std::string path = key.substr(
        std::string_view(kPeftKeyPrefix).size(),
        key.size() - std::string_view(kPeftKeyPrefix).size() - std::string_view(kSuffixA).size());
    const std::string key_where = weights_path + " key " + printable(key);
    TIERMOE_CHECK(!path.empty(), "empty module path in " + printable(key), key_where,
                  "the file is malformed");
    TIERMOE_CHECK(e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F64",
                  "dtype " + printable(e.dtype) + " is not supported", key_where,
                  "store LoRA weights as F32 or BF16");
    if (detail::is_fused_experts_path(path)) {
      detail::FusedLora& w = fused[path];
      (is_a ? w.A : w.B) = file.view(key).clone(MemTag::weights);
      continue;
    }
    TIERMOE_CHECK(matches_targets(path, adapter.config.target_modules),
                  "module " + printable(path) + " is not among target_modules", key_where,
                  "adapter_config.json and the weights disagree; was the config replaced?");
    // PEFT would give this module its own rank or alpha; TierMoE has one of each.
    const int64_t r = detail::pattern_rank(patterns, adapter.config, path, key_where);
    const double alpha = detail::pattern_alpha(patterns, adapter.config, path, key_where);
    TIERMOE_CHECK(r == adapter.config.r && alpha == adapter.config.lora_alpha,
                  str_of("rank_pattern / alpha_pattern give ", printable(path), " rank ", r,
                         " and alpha ", alpha, ", not r ", adapter.config.r, " and lora_alpha ",
                         adapter.config.lora_alpha),
                  key_where,
                  "TierMoE's LoRA has one rank and alpha for every module (the fused experts' "
                  "gate_up_proj at rank 2r and alpha 2*lora_alpha excepted)");
    PeftLoraWeights& w = adapter.modules[path];
    (is_a ? w.A_RI : w.B_OR) = file.view(key).clone(MemTag::weights);
  }
  for (const auto& [path, w] : adapter.modules) {
    check_module_shapes(path, w, adapter.config.r, weights_path);
  }
  detail::convert_fused_experts(adapter, fused, patterns, weights_path);
  TIERMOE_CHECK(!adapter.modules.empty(), "the adapter holds no LoRA weights", weights_path,
                "the file is empty or not a PEFT adapter");
  TIERMOE_CHECK(!adapter.config.target_modules.empty(), "target_modules is empty", config_path,
                "list the adapted module names");
  return adapter;
}

}  // namespace tiermoe
