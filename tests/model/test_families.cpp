// Each MoE family against transformers 5 itself, in f64: a random tiny
// config saved by transformers' save_pretrained, with the loss and every
// gradient transformers computes on two batches (the eval contract's
// windows, and rows of packed documents with masked targets), made by
// scripts/fixtures/make_family_fixture.py (tests/data/families/README.md).
// Loss to 1e-9 relative, each gradient element to 1e-9 * |want| + 1e-9 *
// max|want| of its tensor. Each family's check is also run with one
// family-specific piece taken out, and must then fail.
#include "model/family_fixture.h"

namespace tiermoe {
namespace {

using testing::batch_of;
using testing::check_family;
using testing::expect_peft_loss_and_export;
using testing::expected_of;
using testing::FamilyBatch;
using testing::FamilyDir;
using testing::fill_params;
using testing::forward;
using testing::kFamilies;
using testing::off_by_with;
using testing::with_config;

TEST(FamilyQwen2Moe, EvalWindowsMatchTransformers) { check_family("qwen2_moe", "eval"); }
TEST(FamilyGlm4Moe, EvalWindowsMatchTransformers) { check_family("glm4_moe", "eval"); }
TEST(FamilyQwen3MoeYarn, EvalWindowsMatchTransformers) { check_family("qwen3_moe_yarn", "eval"); }
TEST(FamilyQwen3MoeYarn, PackedDocumentsMatchTransformers) {
  check_family("qwen3_moe_yarn", "packed");
}
TEST(FamilyGlm4Moe, PackedDocumentsMatchTransformers) { check_family("glm4_moe", "packed"); }
TEST(FamilyQwen2Moe, PackedDocumentsMatchTransformers) { check_family("qwen2_moe", "packed"); }
TEST(FamilyGptOss, EvalWindowsMatchTransformers) { check_family("gpt_oss", "eval"); }
TEST(FamilyGptOss, PackedDocumentsMatchTransformers) { check_family("gpt_oss", "packed"); }

// The check sees each Qwen2-MoE piece: a shared expert whose gate is a
// constant 1/2 (gate weights 0), no q/k/v bias, no shared expert at all.
TEST(FamilyQwen2Moe, TheCheckFailsWithoutEachQwen2Piece) {
  EXPECT_GT(off_by_with("qwen2_moe",
                        [](CausalLM& m) { fill_params(m, "shared_expert_gate.weight", 0.0); }),
            1e3);
  EXPECT_GT(off_by_with("qwen2_moe", [](CausalLM& m) { fill_params(m, "_proj.bias", 0.0); }), 1e3);
  EXPECT_GT(off_by_with("qwen2_moe",
                        [](CausalLM& m) { fill_params(m, "shared_expert.down_proj.weight", 0.0); }),
            1e3);
  // And nothing removed is within the tolerance (the lambdas above are the only change).
  EXPECT_LT(off_by_with("qwen2_moe", [](CausalLM&) {}), 1.0);
}

// Weights read in place from the checkpoint (LoRA's frozen base) give the
// same loss as copied ones, bit for bit: the shared expert binds like a dense MLP.
TEST(FamilyQwen2Moe, MappedWeightsGiveTheCopiedLoss) {
  testing::SingleThread one_thread;
  const std::string dir = kFamilies + "qwen2_moe";
  const nlohmann::json expected = expected_of(dir);
  const FamilyBatch b = batch_of(dir, expected, "packed");
  CausalLM copied = CausalLM::from_checkpoint(dir, DType::f64);
  CausalLM mapped = CausalLM::from_checkpoint(dir, DType::f64, nullptr, WeightBinding::mapped);
  EXPECT_EQ(forward(copied, expected, b, false), forward(mapped, expected, b, false));
}

// The check sees each GLM-4.5 piece: the selection-only correction bias
// (zeroed), the ungated shared experts (zeroed), partial rotary (RoPE over
// the whole head instead of half of it), routed_scaling_factor (1 instead of
// 2.5).
TEST_F(FamilyDir, TheCheckFailsWithoutEachGlm4Piece) {
  EXPECT_GT(off_by_with("glm4_moe",
                        [](CausalLM& m) { fill_params(m, "gate.e_score_correction_bias", 0.0); }),
            1e3);
  EXPECT_GT(
      off_by_with("glm4_moe",
                  [](CausalLM& m) { fill_params(m, "shared_experts.down_proj.weight", 0.0); }),
      1e3);
  std::filesystem::create_directories(dir_ / "rope");
  std::filesystem::create_directories(dir_ / "scale");
  const auto rope = with_config("glm4_moe", dir_ / "rope",
                                {{"rope_parameters", {{"partial_rotary_factor", 1.0}}}});
  EXPECT_GT(off_by_with(
                "glm4_moe", [](CausalLM&) {}, rope),
            1e3);
  const auto scale = with_config("glm4_moe", dir_ / "scale", {{"routed_scaling_factor", 1.0}});
  EXPECT_GT(off_by_with(
                "glm4_moe", [](CausalLM&) {}, scale),
            1e3);
  EXPECT_LT(off_by_with("glm4_moe", [](CausalLM&) {}), 1.0);
}

// The check sees YaRN: plain RoPE instead, or YaRN without its cos/sin scale.
TEST_F(FamilyDir, TheCheckFailsWithoutYarn) {
  std::filesystem::create_directories(dir_ / "plain");
  std::filesystem::create_directories(dir_ / "unscaled");
  const auto plain = with_config("qwen3_moe_yarn", dir_ / "plain",
                                 {{"rope_parameters", {{"rope_type", "default"}}}});
  EXPECT_GT(off_by_with(
                "qwen3_moe_yarn", [](CausalLM&) {}, plain),
            1e3);
  const auto unscaled = with_config("qwen3_moe_yarn", dir_ / "unscaled",
                                    {{"rope_parameters", {{"attention_factor", 1.0}}}});
  EXPECT_GT(off_by_with(
                "qwen3_moe_yarn", [](CausalLM&) {}, unscaled),
            1e3);
  EXPECT_LT(off_by_with("qwen3_moe_yarn", [](CausalLM&) {}), 1.0);
}

// A checkpoint with multi-token-prediction layers past the last decoder
// layer (GLM-4.5's model.layers.46.*) loads them as transformers does: not
// at all, and the loss is the same.
TEST_F(FamilyDir, Glm4MtpLayersAreSkippedOnLoad) {
  const std::filesystem::path from = kFamilies + "glm4_moe";
  CheckpointTensors ck = CheckpointTensors::open(from.string());
  NamedTensors tensors;
  for (const std::string& name : ck.names()) tensors.emplace_back(name, ck.load(name, DType::f64));
  tensors.emplace_back("model.layers.3.eh_proj.weight", Tensor::zeros({32, 64}, DType::f64));
  tensors.emplace_back("model.layers.3.enorm.weight", Tensor::zeros({32}, DType::f64));
  save_checkpoint_tensors(dir_.string(), tensors, 5'000'000'000ull);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(from / "config.json"));
  config["num_nextn_predict_layers"] = 1;
  std::ofstream(dir_ / "config.json") << config.dump(2);
  EXPECT_LT(off_by_with(
                "glm4_moe", [](CausalLM&) {}, dir_.string()),
            1.0);
  // Without the field the extra layer is a tensor the config does not use.
  config["num_nextn_predict_layers"] = 0;
  std::ofstream(dir_ / "config.json") << config.dump(2);
  EXPECT_TRUE(
      testing::throws_error_with([&] { CausalLM::from_checkpoint(dir_.string(), DType::f64); },
                                 {"model.layers.3.eh_proj.weight", "does not use"}));
}

// The check sees each gpt-oss piece: the sinks (pushed to -1e4, so no row
// sinks), the window (sliding_window past the rows' length), the clamp
// (swiglu_limit 7 instead of the fixture's 1.5), the router's bias and the
// experts' biases (zeroed), and YaRN's truncate (true instead of false).
TEST_F(FamilyDir, TheCheckFailsWithoutEachGptOssPiece) {
  EXPECT_GT(off_by_with("gpt_oss", [](CausalLM& m) { fill_params(m, "self_attn.sinks", -1e4); }),
            1e3);
  EXPECT_GT(off_by_with("gpt_oss", [](CausalLM& m) { fill_params(m, "mlp.router.bias", 0.0); }),
            1e3);
  EXPECT_GT(
      off_by_with("gpt_oss", [](CausalLM& m) { fill_params(m, "experts.gate_up_proj_bias", 0.0); }),
      1e3);
  EXPECT_GT(
      off_by_with("gpt_oss", [](CausalLM& m) { fill_params(m, "experts.down_proj_bias", 0.0); }),
      1e3);
  const std::pair<const char*, nlohmann::json> configs[] = {
      {"window", {{"sliding_window", 64}}},
      {"limit", {{"swiglu_limit", 7.0}}},
      {"truncate", {{"rope_parameters", {{"truncate", true}}}}}};
  for (const auto& [name, change] : configs) {
    std::filesystem::create_directories(dir_ / name);
    EXPECT_GT(off_by_with(
                  "gpt_oss", [](CausalLM&) {}, with_config("gpt_oss", dir_ / name, change)),
              1e3)
        << name;
  }
  EXPECT_LT(off_by_with("gpt_oss", [](CausalLM&) {}), 1.0);
}

// gpt-oss's x-major experts: bound as transposed copies (LoRA's frozen base)
// they give the copied loss bit for bit, and save_checkpoint writes the
// fixture's tensors back, names, shapes and values.
TEST_F(FamilyDir, GptOssExpertsBindAndSaveInTheirLayout) {
  testing::SingleThread one_thread;
  const std::string dir = kFamilies + "gpt_oss";
  const nlohmann::json expected = expected_of(dir);
  const FamilyBatch b = batch_of(dir, expected, "packed");
  CausalLM copied = CausalLM::from_checkpoint(dir, DType::f64);
  CausalLM mapped = CausalLM::from_checkpoint(dir, DType::f64, nullptr, WeightBinding::mapped);
  EXPECT_EQ(forward(copied, expected, b, false), forward(mapped, expected, b, false));
  copied.save_checkpoint(dir_.string());
  CheckpointTensors mine = CheckpointTensors::open(dir_.string());
  CheckpointTensors theirs = CheckpointTensors::open(dir);
  ASSERT_EQ(mine.names(), theirs.names());
  for (const std::string& name : theirs.names()) {
    EXPECT_TRUE(
        testing::all_close(mine.load(name, DType::f64), theirs.load(name, DType::f64), 0, 0, name));
  }
}

// LoRA on gpt-oss's fused experts is refused, naming the target and what
// works instead; the attention projections adapt.
TEST(FamilyGptOss, LoraOnTheExpertsIsAClearError) {
  CausalLM model = CausalLM::from_checkpoint(kFamilies + "gpt_oss", DType::f32);
  for (const char* target : {"gate_proj", "up_proj", "down_proj"}) {
    LoraConfig cfg;
    cfg.targets = {"q_proj", target};
    EXPECT_TRUE(testing::throws_error_with([&] { model.enable_lora(cfg, 1); },
                                           {target, "gpt-oss's experts", "attention projections"}));
  }
  LoraConfig cfg;
  cfg.targets = {"q_proj", "v_proj"};
  model.enable_lora(cfg, 1);
  EXPECT_EQ(model.lora_params().size(), 2u * 2 * 3);  // A and B, two projections, three layers
}

TEST_F(FamilyDir, Qwen2MoeAdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("qwen2_moe", dir_);
}
TEST_F(FamilyDir, Glm4MoeAdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("glm4_moe", dir_);
}
TEST_F(FamilyDir, GptOssAdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("gpt_oss", dir_);
}
TEST_F(FamilyDir, Qwen3MoeYarnAdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("qwen3_moe_yarn", dir_);
}

}  // namespace
}  // namespace tiermoe
