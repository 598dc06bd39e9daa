// Each family's spec (io/family.h, src/io/families/) against the configs
// transformers itself wrote: its config class at the class defaults
// (tests/data/families/configs/, scripts/fixtures/make_family_configs.py)
// and the committed family fixtures. The field table a family reads by is
// the one it writes by, so a config read, written and read again is the
// same config, and every field TierMoE writes holds the value transformers
// wrote.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tiermoe/io/family.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {
namespace {

using Json = nlohmann::json;
const std::string kData = TIERMOE_TEST_DATA_DIR;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string class_defaults_path(ModelFamily family) {
  return kData + "/families/configs/" + std::string(family_name(family)) + ".json";
}

// Every config.json under tests/data that transformers wrote.
std::vector<std::string> transformers_configs() {
  std::vector<std::string> out;
  for (ModelFamily family : all_families()) out.push_back(class_defaults_path(family));
  for (const auto& entry : std::filesystem::recursive_directory_iterator(kData)) {
    if (entry.path().filename() == "config.json") out.push_back(entry.path().string());
  }
  return out;
}

TEST(FamilySpecs, EachFamilyIsFoundByItsModelTypeAndAliases) {
  ASSERT_EQ(all_families().size(), 11u);
  for (ModelFamily family : all_families()) {
    const FamilySpec& spec = family_spec(family);
    EXPECT_EQ(spec.family, family);
    EXPECT_EQ(family_name(family), spec.model_type);
    EXPECT_NE(supported_model_types().find(spec.model_type), std::string::npos);
    for (std::string_view type : spec.aliases) {
      const ModelConfig c =
          parse_model_config(R"({"model_type": ")" + std::string(type) + R"("})", "alias");
      EXPECT_EQ(c.family, family) << type;
    }
  }
  EXPECT_NE(supported_model_types().find("deepseek_v3 (kimi_k2)"), std::string::npos);
}

// A config.json naming only its model_type reads as the class defaults.
TEST(FamilySpecs, AbsentFieldsReadAsTransformersClassDefaults) {
  for (ModelFamily family : all_families()) {
    const std::string path = class_defaults_path(family);
    SCOPED_TRACE(path);
    const ModelConfig defaults = parse_model_config(read_text(path), path);
    // The fields make_family_configs.py gives a class (GLM-4.5's head_dim:
    // the class has none, and hidden_size // heads is 42.67;
    // and DeepSeek-V2's num_experts_per_tok: null in the class, which cannot route).
    const std::string extra = family == ModelFamily::glm4_moe      ? R"(, "head_dim": 128)"
                              : family == ModelFamily::deepseek_v2 ? R"(, "num_experts_per_tok": 6)"
                                                                   : "";
    const ModelConfig bare = parse_model_config(
        R"({"model_type": ")" + std::string(family_name(family)) + "\"" + extra + "}", "bare");
    EXPECT_EQ(bare.to_json(), defaults.to_json());
    EXPECT_TRUE(bare == defaults);
  }
}

TEST(FamilySpecs, EveryConfigReadsBackIdenticallyFromWhatItWrites) {
  for (const std::string& path : transformers_configs()) {
    SCOPED_TRACE(path);
    ModelConfig c = load_model_config(path);
    const std::string written = c.to_json();
    const ModelConfig again = parse_model_config(written, "written");
    // quantization_config is never written back: TierMoE saves what it holds.
    c.quant_method.clear(), c.quant_bits = 0, c.quant_group = 0;
    EXPECT_TRUE(again == c);
    EXPECT_EQ(again.to_json(), written);
  }
}

// A field TierMoE writes under a name transformers also wrote holds its value.
// What transformers 5 keeps elsewhere (dtype, rope_parameters, renamed
// counts) is compared where it keeps it; the few fields only TierMoE writes
// are named.
TEST(FamilySpecs, EveryFieldWrittenIsTheValueTransformersWrote) {
  // torch_dtype and the RoPE fields where transformers 4 keeps them;
  // DeepSeek's and MiniMax's own configuration code's fields; router_aux_loss_coef
  // (the DeepSeek-V3 family's classes have none: no aux loss).
  const std::set<std::string> only_tiermoe = {
      "torch_dtype", "rope_theta",        "rope_scaling",         "partial_rotary_factor",
      "topk_method", "scoring_func",      "moe_layer_freq",       "head_dim",
      "use_cache",   "max_window_layers", "router_aux_loss_coef", "transformers_version",
      "use_qk_norm", "qk_norm_type",      "use_routing_bias",     "shared_intermediate_size"};
  // transformers 5's names for fields TierMoE writes under transformers 4's.
  const std::map<std::string, std::string> renamed_in_v5 = {
      {"num_experts", "num_local_experts"}, {"num_nextn_predict_layers", "num_mtp_layers"}};
  for (const std::string& path : transformers_configs()) {
    SCOPED_TRACE(path);
    Json hf = Json::parse(read_text(path));
    // A multimodal release (Qwen3.5's): TierMoE reads and writes its text model.
    const bool multimodal = hf.contains("text_config");
    if (multimodal) hf = Json(hf.at("text_config"));
    for (const auto& [v4, v5] : renamed_in_v5) {
      if (!hf.contains(v4) && hf.contains(v5)) hf[v4] = hf.at(v5);
    }
    // Values transformers writes for "none": head_dim null is D / H, and
    // Qwen2-MoE's sliding_window 0 is no window (TierMoE writes null).
    if (hf.contains("head_dim") && hf.at("head_dim").is_null()) {
      hf["head_dim"] =
          hf.at("hidden_size").get<int64_t>() / hf.at("num_attention_heads").get<int64_t>();
    }
    if (hf.contains("sliding_window") && hf.at("sliding_window") == 0)
      hf["sliding_window"] = nullptr;
    const ModelConfig c = load_model_config(path);
    const Json ours = Json::parse(c.to_json());
    for (const auto& [key, value] : ours.items()) {
      if (key == "architectures" && (multimodal || hf.at(key).is_null())) continue;
      if (key == "model_type" && c.model_type != c.spec().model_type) continue;  // an alias
      if (!hf.contains(key)) {
        EXPECT_TRUE(only_tiermoe.contains(key)) << key << " is written but not transformers'";
        continue;
      }
      if (key == "transformers_version" || key == "use_cache") continue;
      EXPECT_EQ(value, hf.at(key)) << key;
    }
    if (const Json* dtype = hf.contains("dtype") ? &hf.at("dtype") : nullptr;
        dtype && !dtype->is_null()) {
      EXPECT_EQ(ours.at("torch_dtype"), *dtype);
    }
    for (const char* key : {"rope_theta", "partial_rotary_factor"}) {
      if (hf.contains("rope_parameters") && hf.at("rope_parameters").contains(key)) {
        EXPECT_EQ(ours.at(key), hf.at("rope_parameters").at(key)) << key;
      }
    }
  }
}

}  // namespace
}  // namespace tiermoe
