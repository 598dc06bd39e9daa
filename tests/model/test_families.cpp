// Each MoE family against transformers 5 itself, in f64: a random tiny
// config saved by transformers' save_pretrained, with the loss and every
// gradient transformers computes on two batches (the eval contract's
// windows, and rows of packed documents with masked targets), made by
// scripts/fixtures/make_family_fixture.py (tests/data/families/README.md).
// Loss to 1e-9 relative, each gradient element to 1e-9 * |want| + 1e-9 *
// max|want| of its tensor. Each family's check is also run with one
// family-specific piece taken out, and must then fail.
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/test_dir.h"
#include "io/test_safetensors_util.h"
#include "model/model_rig.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

const std::string kFamilies = std::string(TIERMOE_TEST_DATA_DIR) + "/families/";
constexpr double kRtol = 1e-9;

struct FamilyBatch {
  std::vector<int32_t> ids, targets;
  TokenLayout layout;
};

std::vector<int32_t> ints(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

// "eval": B windows of tokens.npy; "packed": the rows expected.json holds.
FamilyBatch batch_of(const std::string& dir, const nlohmann::json& expected,
                     const std::string& which) {
  const int64_t L = expected.at("seq_len"), B = expected.at("batch");
  FamilyBatch b;
  if (which == "eval") {
    std::vector<int32_t> tokens = read_tokens(dir + "/tokens.npy");
    b.ids.assign(tokens.begin(), tokens.begin() + B * L);
    b.targets.assign(tokens.begin() + 1, tokens.begin() + B * L + 1);
    return b;
  }
  const nlohmann::json& rows = expected.at(which).at("rows");
  b.ids = ints(rows.at("ids"));
  b.targets = ints(rows.at("targets"));
  b.layout.positions_BT = ints(rows.at("positions"));
  b.layout.doc_start_BT = ints(rows.at("doc_start"));
  return b;
}

nlohmann::json expected_of(const std::string& dir) {
  return nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
}

double forward(CausalLM& model, const nlohmann::json& expected, const FamilyBatch& b, bool grad) {
  const int64_t L = expected.at("seq_len"), B = expected.at("batch");
  return model.forward(b.ids, b.targets, B, L, grad, b.layout);
}

// Loss, its parts and every gradient of `which` against transformers'.
void check_family(const std::string& family, const std::string& which) {
  testing::SingleThread one_thread;  // tiny shapes
  SCOPED_TRACE(family + " " + which);
  const std::string dir = kFamilies + family;
  const nlohmann::json expected = expected_of(dir);
  const nlohmann::json& want = expected.at(which);
  const FamilyBatch b = batch_of(dir, expected, which);

  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  const double loss = forward(model, expected, b, /*grad=*/true);
  model.backward();
  EXPECT_NEAR(loss, double(want.at("loss")), kRtol * double(want.at("loss")));
  EXPECT_NEAR(model.last_loss().ce, double(want.at("ce")), kRtol * double(want.at("ce")));
  // Null where the family's loss has no load-balancing term (DeepSeek-V3's).
  ASSERT_EQ(model.last_loss().aux_in_total, !want.at("aux").is_null());
  if (!want.at("aux").is_null()) {
    EXPECT_NEAR(model.last_loss().aux, double(want.at("aux")), kRtol * double(want.at("aux")));
  }
  EXPECT_EQ(model.last_loss().targets, int64_t(want.at("targets")));
  std::printf("  %s %s: loss %.17g (transformers %.17g)\n", family.c_str(), which.c_str(), loss,
              double(want.at("loss")));
  testing::expect_grads_match(model.params(), dir + "/grads_" + which + ".safetensors", kRtol,
                              family + " " + which);
}

// The eval loss with `remove` applied to the model loaded from `dir` (the
// fixture's, or a copy with another config.json): how far from
// transformers', in units of the check's tolerance.
double off_by_with(const std::string& family, const std::function<void(CausalLM&)>& remove,
                   const std::string& dir_override = "") {
  testing::SingleThread one_thread;
  const std::string fixture = kFamilies + family;
  const std::string dir = dir_override.empty() ? fixture : dir_override;
  const nlohmann::json expected = expected_of(fixture);
  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  remove(model);
  const double want = expected.at("eval").at("loss");
  const double loss = forward(model, expected, batch_of(fixture, expected, "eval"), false);
  return std::abs(loss - want) / (kRtol * want);
}

// A copy of a family's checkpoint with config.json fields changed.
std::string with_config(const std::string& family, const std::filesystem::path& dir,
                        const nlohmann::json& changes) {
  const std::filesystem::path from = kFamilies + family;
  std::filesystem::copy_file(from / "model.safetensors", dir / "model.safetensors");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(from / "config.json"));
  config.merge_patch(changes);
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir.string();
}

// Sets every parameter whose name ends with `suffix` to `value`.
void fill_params(CausalLM& model, const std::string& suffix, double value) {
  int n = 0;
  for (ModelParam& p : model.params()) {
    if (!p.name.ends_with(suffix)) continue;
    p.value.fill(value);
    ++n;
  }
  ASSERT_GT(n, 0) << suffix;
}

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

// PEFT 0.21's loss with the fixture's adapter (TierMoE's export layout:
// attention, dense MLP and shared expert projections by module-path tail),
// and TierMoE's export of the loaded adapter is that file, key for key.
class FamilyDir : public testing::DirTest {
 protected:
  FamilyDir() : DirTest("tiermoe_family_", /*threads=*/1) {}
};

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

// PEFT 0.21's loss with a family's committed adapter (TierMoE's export
// layout: keys under PEFT's module names), and TierMoE's export of the
// loaded adapter is that file, key for key and bit for bit.
void expect_peft_loss_and_export(const std::string& family, const std::filesystem::path& out) {
  testing::SingleThread one_thread;
  const std::string dir = kFamilies + family;
  const nlohmann::json expected = expected_of(dir);
  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  model.load_lora_adapter(dir + "/peft");
  EXPECT_EQ(model.lora_params().size(), 2 * size_t(expected.at("peft").at("adapted_modules")));
  const double want = expected.at("peft").at("loss");
  EXPECT_NEAR(forward(model, expected, batch_of(dir, expected, "eval"), false), want, kRtol * want);

  model.save_lora_adapter(out.string(), DType::f64);
  CheckpointTensors mine = CheckpointTensors::open((out / "adapter_model.safetensors").string());
  CheckpointTensors peft = CheckpointTensors::open(dir + "/peft/adapter_model.safetensors");
  ASSERT_EQ(mine.names(), peft.names());
  for (const std::string& name : peft.names()) {
    EXPECT_TRUE(
        testing::all_close(mine.load(name, DType::f64), peft.load(name, DType::f64), 0, 0, name));
  }
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
