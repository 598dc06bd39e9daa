// DeepSeek-V2 (deepseek_v2) against transformers 5 itself, in f64
// (model/family_fixture.h): DeepSeek-V3's attention under V2's router
// (softmax scores, group-limited by each group's best expert, scaled, not
// renormalised). Each piece the check should see is taken out once, and the
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

TEST(FamilyDeepseekV2, EvalWindowsMatchTransformers) { check_family("deepseek_v2", "eval"); }
TEST(FamilyDeepseekV2, PackedDocumentsMatchTransformers) { check_family("deepseek_v2", "packed"); }

// The check sees the group limit (greedy instead), routed_scaling_factor
// (1), YaRN's mscale_all_dim on the softmax scale (absent) and the shared
// experts (zeroed).
TEST_F(FamilyDir, TheCheckFailsWithoutEachDeepseekV2Piece) {
  EXPECT_LT(off_by_with("deepseek_v2", [](CausalLM&) {}), 1.0);
  EXPECT_GT(
      off_by_with("deepseek_v2",
                  [](CausalLM& m) { fill_params(m, "shared_experts.down_proj.weight", 0.0); }),
      1e3);
  const std::pair<const char*, nlohmann::json> configs[] = {
      {"greedy", {{"topk_method", "greedy"}}},
      {"scale", {{"routed_scaling_factor", 1.0}}},
      {"mscale", {{"rope_parameters", {{"mscale_all_dim", nullptr}}}}}};
  for (const auto& [name, change] : configs) {
    std::filesystem::create_directories(dir_ / name);
    EXPECT_GT(off_by_with(
                  "deepseek_v2", [](CausalLM&) {}, with_config("deepseek_v2", dir_ / name, change)),
              1e3)
        << name;
  }
}

// The router's fields: topk_method picks the selection, n_group and
// topk_group are null unless given and written back so; what transformers'
// class cannot run, or computes otherwise than DeepSeek's code, is refused.
TEST(FamilyDeepseekV2, RouterFieldsReadStrictly) {
  auto parse = [](const std::string& extra) {
    return parse_model_config(
        R"({"model_type": "deepseek_v2", "num_experts_per_tok": 6)" + extra + "}", "config.json");
  };
  const ModelConfig greedy = parse("");
  EXPECT_EQ(greedy.topk_method, "greedy");
  EXPECT_EQ(greedy.n_group, 0);
  EXPECT_TRUE(nlohmann::json::parse(greedy.to_json()).at("n_group").is_null());
  EXPECT_EQ(greedy.shared_expert_intermediate_size, 2 * 1407);
  EXPECT_TRUE(greedy.rope_interleave);  // complex pairs: always
  const ModelConfig grouped =
      parse(R"(, "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3)");
  EXPECT_EQ(grouped.n_group, 8);
  EXPECT_TRUE(testing::throws_error_with(
      [] { parse_model_config(R"({"model_type": "deepseek_v2"})", "config.json"); },
      {"num_experts_per_tok", "absent or null", "6 experts"}));
  EXPECT_TRUE(testing::throws_error_with([&] { parse(R"(, "topk_method": "noaux_tc")"); },
                                         {"topk_method", "noaux_tc"}));
  EXPECT_TRUE(
      testing::throws_error_with([&] { parse(R"(, "topk_method": "group_limited_greedy")"); },
                                 {"n_group 0", "group-limited"}));
  EXPECT_TRUE(testing::throws_error_with(
      [&] { parse(R"(, "topk_method": "group_limited_greedy", "n_group": 16, "topk_group": 1)"); },
      {"topk_group 1", "6 of 64"}));
  EXPECT_TRUE(testing::throws_error_with([&] { parse(R"(, "norm_topk_prob": true)"); },
                                         {"norm_topk_prob", "never renormalises"}));
  EXPECT_TRUE(testing::throws_error_with([&] { parse(R"(, "scoring_func": "sigmoid")"); },
                                         {"scoring_func"}));
}

// The published shapes: V2 group-limited with a q latent, Lite greedy
// without; both with 2 shared experts and layer 0 dense.
TEST(FamilyDeepseekV2, PresetsAreThePublishedConfigs) {
  const ModelConfig v2 = preset("deepseek-v2"), lite = preset("deepseek-v2-lite");
  EXPECT_EQ(v2.family, ModelFamily::deepseek_v2);
  EXPECT_EQ(v2.topk_method, "group_limited_greedy");
  EXPECT_EQ(lite.topk_method, "greedy");
  EXPECT_EQ(lite.q_lora_rank, 0);
  EXPECT_EQ(v2.num_moe_layers(), 59);
  EXPECT_EQ(lite.num_moe_layers(), 26);
  // 236B and 15.7B parameters, 21B and 2.4B active (without the input
  // embedding), as DeepSeek states them.
  auto active = [](const ModelConfig& c) {
    const ParamCounts n = param_counts(c);
    return double(n.active_per_token - n.embedding) / 1e9;
  };
  EXPECT_NEAR(double(param_counts(v2).total) / 1e9, 236, 1);
  EXPECT_NEAR(active(v2), 21, 0.5);
  EXPECT_NEAR(double(param_counts(lite).total) / 1e9, 15.7, 0.1);
  EXPECT_NEAR(active(lite), 2.4, 0.1);
  // What transformers loads back is the preset.
  EXPECT_EQ(parse_model_config(v2.to_json(), "written").to_json(), v2.to_json());
  EXPECT_EQ(parse_model_config(lite.to_json(), "written").to_json(), lite.to_json());
}

TEST_F(FamilyDir, DeepseekV2AdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("deepseek_v2", dir_);
}

}  // namespace
}  // namespace tiermoe
