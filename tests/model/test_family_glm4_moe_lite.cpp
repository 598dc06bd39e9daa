// GLM-4.7-Flash (glm4_moe_lite) against transformers 5 itself, in f64
// (model/family_fixture.h): DeepSeek-V3's attention around GLM-4.5's MoE,
// its dense layers listed in mlp_layer_types. A family that is a spec file
// and its presets: each piece the check should see is taken out once, and the
// check must then fail.
#include "io/test_safetensors_util.h"
#include "model/family_fixture.h"

namespace tiermoe {
namespace {

using testing::check_family;
using testing::expect_peft_loss_and_export;
using testing::FamilyDir;
using testing::fill_params;
using testing::off_by_with;
using testing::with_config;

TEST(FamilyGlm4MoeLite, EvalWindowsMatchTransformers) { check_family("glm4_moe_lite", "eval"); }
TEST(FamilyGlm4MoeLite, PackedDocumentsMatchTransformers) {
  check_family("glm4_moe_lite", "packed");
}

// The check sees the rope dims' interleave (off), routed_scaling_factor (1),
// the correction bias and the shared experts (zeroed).
TEST_F(FamilyDir, TheCheckFailsWithoutEachGlm4MoeLitePiece) {
  EXPECT_LT(off_by_with("glm4_moe_lite", [](CausalLM&) {}), 1.0);
  EXPECT_GT(off_by_with("glm4_moe_lite",
                        [](CausalLM& m) { fill_params(m, "gate.e_score_correction_bias", 0.0); }),
            1e3);
  EXPECT_GT(
      off_by_with("glm4_moe_lite",
                  [](CausalLM& m) { fill_params(m, "shared_experts.down_proj.weight", 0.0); }),
      1e3);
  const std::pair<const char*, nlohmann::json> configs[] = {
      {"interleave", {{"rope_interleave", false}}}, {"scale", {{"routed_scaling_factor", 1.0}}}};
  for (const auto& [name, change] : configs) {
    std::filesystem::create_directories(dir_ / name);
    EXPECT_GT(
        off_by_with(
            "glm4_moe_lite", [](CausalLM&) {}, with_config("glm4_moe_lite", dir_ / name, change)),
        1e3)
        << name;
  }
}

// mlp_layer_types is the model's dense-then-MoE split, both ways: read as
// first_k_dense_replace, written back as the list; absent, the first layer
// is dense; any other order is refused with the field and the layer named.
TEST(FamilyGlm4MoeLite, MlpLayerTypesAreTheDenseFirstLayers) {
  auto parse = [](const std::string& extra) {
    return parse_model_config(
        R"({"model_type": "glm4_moe_lite", "num_hidden_layers": 3)" + extra + "}", "config.json");
  };
  EXPECT_EQ(parse("").first_k_dense_replace, 1);
  const ModelConfig two = parse(R"(, "mlp_layer_types": ["dense", "dense", "sparse"])");
  EXPECT_EQ(two.first_k_dense_replace, 2);
  EXPECT_EQ(nlohmann::json::parse(two.to_json()).at("mlp_layer_types"),
            nlohmann::json({"dense", "dense", "sparse"}));
  EXPECT_TRUE(testing::throws_error_with(
      [&] { parse(R"(, "mlp_layer_types": ["dense", "sparse", "dense"])"); },
      {"mlp_layer_types", "'dense' at layer 2"}));
  EXPECT_TRUE(
      testing::throws_error_with([&] { parse(R"(, "mlp_layer_types": ["dense", "sparse"])"); },
                                 {"mlp_layer_types", "2 layers of 3"}));
  EXPECT_TRUE(testing::throws_error_with(
      [&] { parse(R"(, "rope_parameters": {"partial_rotary_factor": 0.5})"); },
      {"partial_rotary_factor 0.5", "multi-head latent attention"}));
}

// The preset is the class's defaults, as transformers 5.25 saves them (the
// family's table reads them; this holds the preset to that file).
TEST(FamilyGlm4MoeLite, ThePresetIsTheClassDefaults) {
  ModelConfig defaults = load_model_config(testing::kFamilies + "configs/glm4_moe_lite.json");
  const ModelConfig p = preset("glm-4.7-flash");
  defaults.torch_dtype = p.torch_dtype;  // a bare class says float32; presets are stored in bf16
  EXPECT_EQ(p.family, ModelFamily::glm4_moe_lite);
  EXPECT_EQ(p.to_json(), defaults.to_json());
  EXPECT_EQ(p.num_moe_layers(), 46);
}

TEST_F(FamilyDir, Glm4MoeLiteAdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("glm4_moe_lite", dir_);
}

}  // namespace
}  // namespace tiermoe
