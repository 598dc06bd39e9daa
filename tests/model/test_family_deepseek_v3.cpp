// DeepSeek-V3 (and Kimi-K2, the same architecture) against transformers 5
// itself, in f64 (model/family_fixture.h): multi-head latent attention in
// both its forms, through a q latent with interleaved rope dims and YaRN's
// mscale ("deepseek_v3"), and q_proj straight from the hidden state with
// attention_bias and plain RoPE ("deepseek_v3_q_proj"); GLM-4.5's MoE around
// it. Each family-specific piece is taken out once, and the check must then fail.
#include "model/family_fixture.h"
#include "tiermoe/model/rope_frequencies.h"

namespace tiermoe {
namespace {

using testing::check_family;
using testing::expect_peft_loss_and_export;
using testing::FamilyDir;
using testing::fill_params;
using testing::kFamilies;
using testing::off_by_with;
using testing::with_config;

TEST(FamilyDeepseekV3, EvalWindowsMatchTransformers) { check_family("deepseek_v3", "eval"); }
TEST(FamilyDeepseekV3, PackedDocumentsMatchTransformers) { check_family("deepseek_v3", "packed"); }
TEST(FamilyDeepseekV3, WithoutQLatentEvalWindowsMatchTransformers) {
  check_family("deepseek_v3_q_proj", "eval");
}
TEST(FamilyDeepseekV3, WithoutQLatentPackedDocumentsMatchTransformers) {
  check_family("deepseek_v3_q_proj", "packed");
}

// The check sees each DeepSeek-V3 piece: the rope dims' interleave (off),
// YaRN's mscale_all_dim on the softmax scale (absent), the shared rope key
// (zeroed: the kv_a rows past the latent), the selection-only correction
// bias (zeroed), the shared experts (zeroed), routed_scaling_factor (1).
TEST_F(FamilyDir, TheCheckFailsWithoutEachDeepseekV3Piece) {
  EXPECT_GT(off_by_with("deepseek_v3",
                        [](CausalLM& m) { fill_params(m, "gate.e_score_correction_bias", 0.0); }),
            1e3);
  EXPECT_GT(
      off_by_with("deepseek_v3",
                  [](CausalLM& m) { fill_params(m, "shared_experts.down_proj.weight", 0.0); }),
      1e3);
  EXPECT_GT(off_by_with("deepseek_v3",
                        [](CausalLM& m) {
                          for (ModelParam& p : m.params()) {
                            if (!p.name.ends_with("kv_a_proj_with_mqa.weight")) continue;
                            const int64_t latent = m.config().kv_lora_rank;
                            p.value.rows(latent, p.value.size(0)).zero();
                          }
                        }),
            1e3);
  const std::pair<const char*, nlohmann::json> configs[] = {
      {"interleave", {{"rope_interleave", false}}},
      {"mscale", {{"rope_parameters", {{"mscale_all_dim", nullptr}}}}},
      {"scale", {{"routed_scaling_factor", 1.0}}}};
  for (const auto& [name, change] : configs) {
    std::filesystem::create_directories(dir_ / name);
    EXPECT_GT(off_by_with(
                  "deepseek_v3", [](CausalLM&) {}, with_config("deepseek_v3", dir_ / name, change)),
              1e3)
        << name;
  }
  EXPECT_LT(off_by_with("deepseek_v3", [](CausalLM&) {}), 1.0);
  EXPECT_LT(off_by_with("deepseek_v3_q_proj", [](CausalLM&) {}), 1.0);
  // The q_proj form's bias on kv_a_proj_with_mqa and o_proj.
  EXPECT_GT(off_by_with("deepseek_v3_q_proj",
                        [](CausalLM& m) { fill_params(m, "kv_a_proj_with_mqa.bias", 0.0); }),
            1e3);
}

// YaRN's softmax scale as transformers' yarn_apply_mscale computes it:
// 1/sqrt(qk_head_dim) * (0.1 * mscale_all_dim * ln(factor) + 1)^2 under MLA,
// none without mscale_all_dim, and none for GQA families.
TEST(FamilyDeepseekV3, SoftmaxScaleFollowsYarnMscale) {
  ModelConfig c = preset("deepseek-v3");
  const double mscale = 0.1 * 1.0 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(attention_softmax_scale(c), mscale * mscale / std::sqrt(192.0));
  c.rope_scaling.mscale_all_dim.reset();
  EXPECT_DOUBLE_EQ(attention_softmax_scale(c), 1.0 / std::sqrt(192.0));
  ModelConfig qwen = preset("qwen3-30b-a3b");
  qwen.rope_scaling = {.kind = RopeScaling::Kind::yarn, .factor = 4.0, .mscale_all_dim = 1.0};
  EXPECT_DOUBLE_EQ(attention_softmax_scale(qwen), 1.0 / std::sqrt(128.0));
}

TEST_F(FamilyDir, DeepseekV3AdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("deepseek_v3", dir_);
}
TEST_F(FamilyDir, DeepseekV3WithoutQLatentAdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("deepseek_v3_q_proj", dir_);
}

// A checkpoint written by TierMoE is the fixture's, name for name and bit for bit.
TEST_F(FamilyDir, DeepseekV3SavesTheCheckpointItLoaded) {
  const std::string dir = kFamilies + "deepseek_v3";
  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  model.save_checkpoint(dir_.string());
  CheckpointTensors mine = CheckpointTensors::open(dir_.string());
  CheckpointTensors theirs = CheckpointTensors::open(dir);
  ASSERT_EQ(mine.names(), theirs.names());
  for (const std::string& name : theirs.names()) {
    EXPECT_TRUE(
        testing::all_close(mine.load(name, DType::f64), theirs.load(name, DType::f64), 0, 0, name));
  }
}

}  // namespace
}  // namespace tiermoe
