// PEFT LoRA adapters: export then import round-trips exactly, the files carry
// PEFT's keys and layout, and each malformed adapter gives its own Error.
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/io/peft.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

using Json = nlohmann::json;
using testing::bitwise_equal;
using testing::random_tensor;
using testing::TempDir;
using testing::throws_error_with;

constexpr int64_t kR = 4, kD = 12, kF = 6, kQ = 16;

const std::string kQPath = "model.layers.0.self_attn.q_proj";
const std::string kGatePath = "model.layers.1.mlp.experts.1.gate_proj";
const std::string kDownPath = "model.layers.1.mlp.experts.0.down_proj";

PeftLoraConfig test_config() {
  PeftLoraConfig c;
  c.r = kR;
  c.lora_alpha = 16;
  c.use_rslora = true;
  c.target_modules = {"down_proj", "gate_proj", "q_proj"};
  c.base_model_name_or_path = "Qwen/Qwen3-30B-A3B";
  return c;
}

// q_proj [Q, D], two experts' gate_proj [F, D] and down_proj [D, F].
PeftLoraModules test_modules(DType dtype, uint64_t seed = 1) {
  Rng rng(seed);
  PeftLoraModules m;
  m[kQPath] = {random_tensor({kR, kD}, dtype, rng), random_tensor({kQ, kR}, dtype, rng)};
  for (int e = 0; e < 2; ++e) {
    std::string p = "model.layers.1.mlp.experts." + std::to_string(e);
    m[p + ".gate_proj"] = {random_tensor({kR, kD}, dtype, rng),
                           random_tensor({kF, kR}, dtype, rng)};
    m[p + ".down_proj"] = {random_tensor({kR, kF}, dtype, rng),
                           random_tensor({kD, kR}, dtype, rng)};
  }
  return m;
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

void write_json(const std::string& path, const Json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2);
}

void expect_same_modules(const PeftLoraModules& got, const PeftLoraModules& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [path, w] : want) {
    ASSERT_TRUE(got.contains(path)) << path;
    EXPECT_TRUE(bitwise_equal(got.at(path).A_RI, w.A_RI, path + ".lora_A"));
    EXPECT_TRUE(bitwise_equal(got.at(path).B_OR, w.B_OR, path + ".lora_B"));
  }
}

TEST(Peft, RoundTripIsExactInF32) {
  TempDir dir;
  PeftLoraModules modules = test_modules(DType::f32);
  save_peft_adapter(dir.path().string(), test_config(), modules);
  PeftAdapter back = load_peft_adapter(dir.path().string());
  EXPECT_EQ(back.config, test_config());
  expect_same_modules(back.modules, modules);
}

TEST(Peft, Bf16StorageRoundsOnceAndRoundTrips) {
  TempDir dir;
  PeftLoraModules modules = test_modules(DType::f32);
  save_peft_adapter(dir.path().string(), test_config(), modules, DType::bf16);
  PeftAdapter back = load_peft_adapter(dir.path().string());
  PeftLoraModules rounded;
  for (const auto& [path, w] : modules)
    rounded[path] = {w.A_RI.to(DType::bf16), w.B_OR.to(DType::bf16)};
  expect_same_modules(back.modules, rounded);

  // Saving what was loaded writes the same bytes again.
  TempDir dir2;
  save_peft_adapter(dir2.path().string(), back.config, back.modules, DType::bf16);
  expect_same_modules(load_peft_adapter(dir2.path().string()).modules, rounded);
}

TEST(Peft, ConfigHasPeftKeysAndDefaults) {
  TempDir dir;
  PeftLoraConfig cfg = test_config();
  cfg.target_modules = {"q_proj", "down_proj", "gate_proj"};  // unsorted on purpose
  save_peft_adapter(dir.path().string(), cfg, test_modules(DType::f32));
  Json j = read_json(dir.file(kPeftConfigFile));

  // The fields PEFT's LoraConfig.to_dict() writes.
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  std::set<std::string> want = {"alpha_pattern",
                                "auto_mapping",
                                "base_model_name_or_path",
                                "bias",
                                "exclude_modules",
                                "fan_in_fan_out",
                                "inference_mode",
                                "init_lora_weights",
                                "layer_replication",
                                "layers_pattern",
                                "layers_to_transform",
                                "loftq_config",
                                "lora_alpha",
                                "lora_bias",
                                "lora_dropout",
                                "megatron_config",
                                "megatron_core",
                                "modules_to_save",
                                "peft_type",
                                "r",
                                "rank_pattern",
                                "revision",
                                "target_modules",
                                "task_type",
                                "use_dora",
                                "use_rslora"};
  EXPECT_EQ(keys, want);

  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], kR);
  EXPECT_TRUE(j["lora_alpha"].is_number_integer());  // PEFT's field is an int
  EXPECT_EQ(j["lora_alpha"], 16);
  EXPECT_TRUE(j["lora_dropout"].is_number_float());
  EXPECT_EQ(j["lora_dropout"], 0.0);
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["fan_in_fan_out"], false);
  EXPECT_EQ(j["use_rslora"], true);
  EXPECT_EQ(j["use_dora"], false);
  EXPECT_EQ(j["init_lora_weights"], true);
  EXPECT_EQ(j["inference_mode"], true);
  EXPECT_TRUE(j["modules_to_save"].is_null());
  EXPECT_TRUE(j["revision"].is_null());
  EXPECT_TRUE(j["layers_to_transform"].is_null());
  EXPECT_EQ(j["rank_pattern"], Json::object());
  EXPECT_EQ(j["alpha_pattern"], Json::object());
  EXPECT_EQ(j["base_model_name_or_path"], "Qwen/Qwen3-30B-A3B");
  EXPECT_EQ(j["target_modules"], Json({"down_proj", "gate_proj", "q_proj"}));
}

TEST(Peft, WeightsUsePeftKeysAndShapes) {
  TempDir dir;
  save_peft_adapter(dir.path().string(), test_config(), test_modules(DType::f32));
  SafetensorsFile f = SafetensorsFile::open(dir.file(kPeftWeightsFile));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.entries().size(), 10u);
  const std::string q = "base_model.model.model.layers.0.self_attn.q_proj";
  EXPECT_EQ(f.entry(q + ".lora_A.weight").shape, (Shape{kR, kD}));
  EXPECT_EQ(f.entry(q + ".lora_B.weight").shape, (Shape{kQ, kR}));
  const std::string g = "base_model.model.model.layers.1.mlp.experts.1.gate_proj";
  EXPECT_EQ(f.entry(g + ".lora_A.weight").shape, (Shape{kR, kD}));
  EXPECT_EQ(f.entry(g + ".lora_B.weight").shape, (Shape{kF, kR}));
  const std::string d = "base_model.model.model.layers.1.mlp.experts.0.down_proj";
  EXPECT_EQ(f.entry(d + ".lora_A.weight").shape, (Shape{kR, kF}));
  EXPECT_EQ(f.entry(d + ".lora_B.weight").shape, (Shape{kD, kR}));
  EXPECT_EQ(f.entry(d + ".lora_B.weight").dtype, "F32");
}

TEST(Peft, SaveRejectsInconsistentModules) {
  TempDir dir;
  PeftLoraModules m = test_modules(DType::f32);
  m[kQPath].B_OR = Tensor::zeros({kQ, kR + 1}, DType::f32);
  EXPECT_TRUE(throws_error_with([&] { save_peft_adapter(dir.path().string(), test_config(), m); },
                                {"rank mismatch", kQPath}));
  m = test_modules(DType::f32);
  m["model.layers.0.self_attn.v_proj"] = m[kQPath];
  EXPECT_TRUE(throws_error_with([&] { save_peft_adapter(dir.path().string(), test_config(), m); },
                                {"matches no target_modules", "v_proj"}));
  EXPECT_FALSE(std::filesystem::exists(dir.file(kPeftWeightsFile)));
}

// A valid adapter in a fresh directory, for one malformed edit.
struct Fixture {
  TempDir dir;
  Fixture() { save_peft_adapter(dir.path().string(), test_config(), test_modules(DType::f32)); }
  std::string path() const { return dir.path().string(); }
  void edit_config(const std::function<void(Json&)>& edit) {
    Json j = read_json(dir.file(kPeftConfigFile));
    edit(j);
    write_json(dir.file(kPeftConfigFile), j);
  }
  void replace_tensors(const std::function<void(NamedTensors&)>& edit) {
    SafetensorsFile f = SafetensorsFile::open(dir.file(kPeftWeightsFile));
    NamedTensors t;
    for (const SafetensorsEntry& e : f.entries()) t.emplace_back(e.name, f.view(e.name).clone());
    edit(t);
    save_safetensors(dir.file(kPeftWeightsFile), t);
  }
  ::testing::AssertionResult load_fails_with(std::vector<std::string> needles) const {
    return throws_error_with([&] { load_peft_adapter(path()); }, needles);
  }
};

struct ConfigCase {
  const char* name;
  std::function<void(Json&)> edit;
  std::vector<std::string> needles;
};

// layers_to_transform as PEFT writes it: one index or a list (sorted, no
// repeats on read), and back on save; null: every layer.
TEST(Peft, LayersToTransformIsReadAndWritten) {
  for (const auto& [given, want] : {std::pair{Json(3), std::vector<int64_t>{3}},
                                    std::pair{Json({2, 0, 2}), std::vector<int64_t>{0, 2}},
                                    std::pair{Json(nullptr), std::vector<int64_t>{}}}) {
    Fixture fx;
    fx.edit_config([&](Json& j) {
      j["layers_to_transform"] = given;
      j["layers_pattern"] = "layers";
    });
    const PeftAdapter a = load_peft_adapter(fx.path());
    EXPECT_EQ(a.config.layers_to_transform, want) << given.dump();
    TempDir out;
    save_peft_adapter(out.path().string(), a.config, a.modules);
    const Json saved = read_json(out.file(kPeftConfigFile));
    EXPECT_EQ(saved.at("layers_to_transform"), want.empty() ? Json(nullptr) : Json(want));
  }
}

TEST(PeftMalformed, ConfigErrorsNameFileAndKey) {
  std::vector<ConfigCase> cases = {
      {"peft_type", [](Json& j) { j["peft_type"] = "IA3"; }, {"IA3", "not LORA", "key peft_type"}},
      {"dora", [](Json& j) { j["use_dora"] = true; }, {"DoRA", "key use_dora"}},
      {"modules_to_save",
       [](Json& j) { j["modules_to_save"] = {"lm_head"}; },
       {"lm_head", "key modules_to_save"}},
      {"bias", [](Json& j) { j["bias"] = "all"; }, {"bias is all", "key bias"}},
      {"lora_bias", [](Json& j) { j["lora_bias"] = true; }, {"key lora_bias"}},
      {"fan_in_fan_out", [](Json& j) { j["fan_in_fan_out"] = true; }, {"key fan_in_fan_out"}},
      // PEFT gives a module its own rank or alpha; TierMoE has one of each.
      {"rank_pattern",
       [](Json& j) {
         j["rank_pattern"] = {{"q_proj", 2}};
       },
       {"give model.layers.0.self_attn.q_proj rank 2", "one rank", kPeftWeightsFile}},
      {"alpha_pattern",
       [](Json& j) {
         j["alpha_pattern"] = {{".*\\.q_proj", 2}};
       },
       {"q_proj rank 4 and alpha 2", kPeftWeightsFile}},
      {"rank_pattern not a regex",
       [](Json& j) {
         j["rank_pattern"] = {{"(((", 2}};
       },
       {"not a regular expression", "key rank_pattern"}},
      // What the fuzzer fed std::regex: a nested quantifier (minutes of
      // backtracking) and a backreference past 2^63 (overflow in its parser).
      {"rank_pattern nested quantifier",
       [](Json& j) {
         j["rank_pattern"] = {{".**\\.gate_up_proj", 2}};
       },
       {"not a regular expression TierMoE reads", "'*' follows nothing", "key rank_pattern"}},
      {"alpha_pattern huge backreference",
       [](Json& j) {
         j["alpha_pattern"] = {{".*\\2222222222222222222222222.gate_up_proj", 2}};
       },
       {"only punctuation may be escaped", "key alpha_pattern"}},
      {"rank_pattern a tail of the path",
       [](Json& j) {
         j["rank_pattern"] = {{"layers.0.self_attn.q_proj", 2}};
       },
       {"give model.layers.0.self_attn.q_proj rank 2", kPeftWeightsFile}},
      {"target_parameters names the router",
       [](Json& j) { j["target_parameters"] = {"mlp.gate.weight"}; },
       {"mlp.gate.weight", "never the router", "key target_parameters"}},
      {"regex targets",
       [](Json& j) { j["target_modules"] = ".*q_proj"; },
       {"regular expression", "key target_modules"}},
      {"r missing", [](Json& j) { j.erase("r"); }, {"r must be a positive integer", "key r"}},
      {"r not int", [](Json& j) { j["r"] = 4.5; }, {"key r"}},
      {"alpha type", [](Json& j) { j["lora_alpha"] = "16"; }, {"a number", "key lora_alpha"}},
      {"rank differs from r",
       [](Json& j) { j["r"] = kR * 2; },
       {"has rank 4 but r is 8", kPeftWeightsFile}},
      {"layers_to_transform not an index",
       [](Json& j) {
         j["layers_to_transform"] = {0, -1};
       },
       {"layer index >= 0", "key layers_to_transform"}},
      {"layers_pattern other than layers",
       [](Json& j) { j["layers_pattern"] = "h"; },
       {"layers_pattern \"h\" is not supported", "key layers_pattern"}},
      {"module not targeted",
       [](Json& j) {
         j["target_modules"] = {"q_proj", "gate_proj"};
       },
       {"down_proj", "not among target_modules", kPeftWeightsFile}},
  };
  for (const ConfigCase& c : cases) {
    SCOPED_TRACE(c.name);
    Fixture fx;
    fx.edit_config(c.edit);
    std::vector<std::string> needles = c.needles;
    needles.push_back(fx.path());
    EXPECT_TRUE(fx.load_fails_with(needles));
  }
}

TEST(PeftMalformed, TensorErrorsNameFileAndKey) {
  const std::string q = "base_model.model." + kQPath;
  {
    Fixture fx;
    fx.replace_tensors([&](NamedTensors& t) {
      std::erase_if(t, [&](const auto& p) { return p.first == q + ".lora_B.weight"; });
    });
    EXPECT_TRUE(fx.load_fails_with({"lacks", q + ".lora_B.weight", kPeftWeightsFile}));
  }
  {
    Fixture fx;
    fx.replace_tensors([&](NamedTensors& t) {
      for (auto& [name, tensor] : t) {
        if (name == q + ".lora_B.weight") tensor = Tensor::zeros({kQ, kR - 1}, DType::f32);
      }
    });
    EXPECT_TRUE(fx.load_fails_with({"rank mismatch", q + ".lora_B.weight", kPeftWeightsFile}));
  }
  {
    Fixture fx;
    fx.replace_tensors([&](NamedTensors& t) {
      t.emplace_back(q + ".lora_B.bias", Tensor::zeros({kQ}, DType::f32));
    });
    EXPECT_TRUE(fx.load_fails_with({"unexpected tensor", q + ".lora_B.bias", kPeftWeightsFile}));
  }
  {
    Fixture fx;
    fx.replace_tensors([&](NamedTensors& t) {
      t.emplace_back(q + ".lora_magnitude_vector", Tensor::zeros({kQ}, DType::f32));
    });
    EXPECT_TRUE(fx.load_fails_with({"unexpected tensor", "lora_magnitude_vector"}));
  }
  {
    Fixture fx;  // an adapter name left in the key
    fx.replace_tensors([&](NamedTensors& t) {
      t.emplace_back(q + ".default.lora_A.weight", Tensor::zeros({kR, kD}, DType::f32));
    });
    EXPECT_TRUE(fx.load_fails_with({"q_proj.default", "not among target_modules"}));
  }
  {
    Fixture fx;
    fx.replace_tensors([&](NamedTensors& t) {
      for (auto& [name, tensor] : t) {
        if (name == q + ".lora_A.weight") tensor = Tensor::zeros({kR, kD, 1}, DType::f32);
      }
    });
    EXPECT_TRUE(fx.load_fails_with({"2-D", q + ".lora_A.weight"}));
  }
}

TEST(PeftMalformed, MissingFiles) {
  {
    Fixture fx;
    std::filesystem::remove(fx.dir.file(kPeftWeightsFile));
    EXPECT_TRUE(fx.load_fails_with({"adapter weights not found", kPeftWeightsFile}));
  }
  {
    Fixture fx;
    std::filesystem::remove(fx.dir.file(kPeftConfigFile));
    EXPECT_TRUE(fx.load_fails_with({"adapter config not found", kPeftConfigFile}));
  }
  {
    Fixture fx;
    std::ofstream(fx.dir.file(kPeftConfigFile), std::ios::trunc) << "{\"r\": 4,";
    EXPECT_TRUE(fx.load_fails_with({"not valid JSON", kPeftConfigFile}));
  }
}

}  // namespace
}  // namespace tiermoe
