// The memory plan (train/memory_plan.h) against the measured peaks: every
// tag within 10% on the tiny and small presets, LoRA and full fine-tuning,
// several remat policies and dtypes; a LoRA run from a bf16 checkpoint puts
// its matrices under `mapped`; a run that cannot fit --max-memory is refused
// before the model is built, saying what would fit.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/tier_runs.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/model/checkpoint.h"
#include "tiermoe/train/memory_plan.h"
#include "tiermoe/train/trainer_session.h"

namespace tiermoe {
namespace {

// Two of tiny's 4 KiB expert matrices per shard: some expert's gate_proj and
// up_proj land in different files.
constexpr uint64_t kSplitShardBytes = 10000;

using detail::str_of;
using testing::TempDir;
using testing::throws_error_with;

struct Case {
  std::string preset;
  bool lora;
  DType dtype;
  std::string remat;
  int64_t batch, seq_len;
  // LoRA on the experts too; without, the default targets (attention) leave
  // the experts frozen on the grouped kernels, with their packed copies.
  bool adapt_experts = true;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  std::string remat = c.remat;
  for (char& ch : remat) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  std::string preset = c.preset;
  for (char& ch : preset) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return preset + (c.lora ? (c.adapt_experts ? "_lora_" : "_lora_attn_") : "_full_") +
         std::string(dtype_name(c.dtype)) + "_" + remat + "_" + std::to_string(c.batch) + "x" +
         std::to_string(c.seq_len);
}

TrainConfig config_of(const Case& k) {
  TrainConfig c;
  c.preset = k.preset;
  c.dtype = k.dtype;
  c.seed = 3;
  c.corpus_tokens = 1 << 14;
  c.remat = k.remat;
  c.trainer.steps = 2;
  c.trainer.batch = k.batch;
  c.trainer.seq_len = k.seq_len;
  if (k.lora) {
    c.lora = LoraConfig{};
    c.lora->rank = 4;
    c.lora->targets = lora_default_targets(preset(k.preset));  // the attention's (MLA's own)
    if (k.adapt_experts) c.lora->targets.insert({"gate_proj", "up_proj", "down_proj"});
  }
  return c;
}

// Every tag's prediction within 10% of the measured peak; a tag measured 0
// is planned 0.
void expect_within_10_percent(const nlohmann::json& plan, const std::string& what) {
  for (size_t i = 0; i < kNumMemTags; ++i) {
    const std::string tag(mem_tag_name(MemTag(i)));
    const double predicted = plan.at(tag).at("predicted").get<double>();
    const double measured = plan.at(tag).at("measured").get<double>();
    if (measured == 0) {
      EXPECT_EQ(predicted, 0) << what << ": " << tag;
      continue;
    }
    EXPECT_NEAR(predicted / measured, 1.0, 0.10)
        << what << ": " << tag << " predicted " << predicted << ", measured " << measured;
  }
}

class MemoryPlanCases : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { set_num_threads(1); }
  void TearDown() override { set_num_threads(0); }
};

TEST_P(MemoryPlanCases, EveryTagWithinTenPercentOfTheMeasuredPeak) {
  const TrainSummary s = run_training(config_of(GetParam()), RunControl{});
  ASSERT_FALSE(s.memory_plan.is_null());
  expect_within_10_percent(s.memory_plan, case_name({GetParam(), 0}));
}

INSTANTIATE_TEST_SUITE_P(
    Presets, MemoryPlanCases,
    ::testing::Values(Case{"tiny", true, DType::f32, "none", 4, 64},
                      Case{"tiny", false, DType::f32, "none", 4, 64},
                      Case{"tiny", false, DType::bf16, "default", 4, 64},
                      Case{"tiny", true, DType::bf16, "full", 8, 32},
                      Case{"small", true, DType::f32, "none", 2, 128},
                      Case{"small", false, DType::f32, "none", 2, 128},
                      Case{"small", false, DType::bf16, "full", 2, 128},
                      Case{"small", true, DType::f32, "save-w2-only", 4, 64},
                      Case{"tiny", true, DType::bf16, "none", 4, 64, false},
                      Case{"tiny", true, DType::f32, "default", 4, 64, false},
                      Case{"small", true, DType::bf16, "none", 2, 128, false},
                      Case{"tiny-qwen2-moe", true, DType::f32, "none", 4, 64},
                      Case{"tiny-qwen2-moe", false, DType::bf16, "default", 4, 64},
                      Case{"tiny-qwen2-moe", true, DType::bf16, "none", 4, 64, false},
                      Case{"tiny-qwen2-moe", true, DType::bf16, "full", 4, 64},  // shared replays
                      Case{"tiny-deepseek-v3", true, DType::f32, "none", 4, 64},
                      Case{"tiny-deepseek-v3", false, DType::bf16, "default", 4, 64},
                      Case{"tiny-deepseek-v3", true, DType::bf16, "none", 4, 64, false},
                      Case{"tiny-deepseek-v3", false, DType::f32, "full", 4, 64},
                      Case{"tiny-glm4-moe-lite", true, DType::bf16, "default", 4, 64},
                      Case{"tiny-deepseek-v2", false, DType::bf16, "default", 4, 64},
                      Case{"tiny-minimax-m2", true, DType::bf16, "default", 4, 64, false},
                      Case{"tiny-qwen3.5-moe", true, DType::bf16, "default", 4, 64},
                      Case{"tiny-qwen3.5-moe", false, DType::f32, "none", 4, 64}),
    case_name);

// A random tiny model saved in `dir` as a bf16 checkpoint (shards of at most
// `max_shard_bytes`), and the f32 LoRA run that reads it.
TrainConfig lora_on_tiny_bf16_checkpoint(const std::string& dir,
                                         uint64_t max_shard_bytes = 5'000'000'000ull) {
  {
    TrainConfig init = config_of({"tiny", false, DType::bf16, "none", 1, 8});
    CausalLM model = build_model(init);
    model.save_checkpoint(dir, DType::bf16, max_shard_bytes);
  }
  TrainConfig c = config_of({"tiny", true, DType::f32, "none", 4, 64});
  c.model_dir = dir;
  c.corpus_tokens = 1 << 14;
  return c;
}

// A LoRA run from a bf16 checkpoint in f32: the matrices are planned (and
// measured) under `mapped` at bf16 width, and `weights` holds no f32 copy.
TEST(MemoryPlan, LoraFromABf16CheckpointPlansTheMatricesMapped) {
  set_num_threads(1);
  TempDir dir;
  const ModelConfig mc = preset("tiny");
  const TrainConfig c = lora_on_tiny_bf16_checkpoint(dir.path().string());
  const TrainSummary s = run_training(c, RunControl{});
  expect_within_10_percent(s.memory_plan, "tiny LoRA from bf16");
  const MemoryPlan p = plan_memory(c, mc, DType::bf16);
  size_t matrices = 0;
  for (const HfTensor& t : hf_tensors(mc)) {
    if (t.role != HfRole::norm && t.role != HfRole::router && t.role != HfRole::bias) {
      matrices += size_t(shape_numel(t.shape));
    }
  }
  EXPECT_EQ(p.peak[size_t(MemTag::mapped)], matrices * 2);
  EXPECT_EQ(s.memory_plan.at("mapped").at("measured").get<size_t>(), matrices * 2);
  set_num_threads(0);
}

// Shards cut between an expert's gate_proj and up_proj (huggingface_hub's
// split does): that W13 is one copy under `weights`, not a view, and the plan
// says so exactly (it counted the copy under `mapped` before).
TEST(MemoryPlan, W13PartsSplitAcrossShardsArePlannedAsCopies) {
  set_num_threads(1);
  TempDir dir;
  const ModelConfig mc = preset("tiny");
  const TrainConfig c = lora_on_tiny_bf16_checkpoint(dir.path().string(), kSplitShardBytes);
  const int64_t copied = copied_w13_elements(CheckpointTensors::open(dir.path().string()), mc,
                                             DType::f32, 0, mc.num_experts);
  ASSERT_GT(copied, 0) << "the shard size should cut some W13 pair";
  const TrainSummary s = run_training(c, RunControl{});
  for (const char* tag : {"weights", "mapped"}) {
    EXPECT_EQ(s.memory_plan.at(tag).at("predicted").get<size_t>(),
              s.memory_plan.at(tag).at("measured").get<size_t>())
        << tag;
  }
  set_num_threads(0);
}

// A wide router (D 256, E 64) over few tokens: the router's backward, with
// dx and W widened to fp32 in a bf16 run, is the layer's largest transient;
// in an f32 run on the bf16 checkpoint, the mixed-width products' scratch
// (the weights widened block by block) is.
TEST(MemoryPlan, RouterAndMixedWidthTransientsAtFewTokens) {
  set_num_threads(1);
  TempDir dir;
  ModelConfig mc = preset("tiny");
  mc.hidden_size = 256;
  mc.num_experts = 64;
  CausalLM(mc, DType::bf16).save_checkpoint(dir.path().string(), DType::bf16);
  for (DType dt : {DType::bf16, DType::f32}) {
    TrainConfig c = config_of({"tiny", true, dt, "none", 1, 16});
    c.model_dir = dir.path().string();
    const TrainSummary s = run_training(c, RunControl{});
    expect_within_10_percent(s.memory_plan, str_of("wide router, ", dtype_name(dt)));
  }
  set_num_threads(0);
}

// A checkpoint with fused expert stacks (transformers 5's gate_up_proj, the
// committed f64 fixture) binds [E, ...] stacks, so an f32 LoRA run's frozen
// experts run on the grouped kernels: their packed copies are planned under
// `weights` exactly.
TEST(MemoryPlan, FusedExpertStacksFromACheckpointPlanTheirPacks) {
  set_num_threads(1);
  TempDir dir;
  const std::string model = std::string(TIERMOE_TEST_DATA_DIR) + "/peft_v5/model";
  ASSERT_TRUE(stores_fused_experts(CheckpointTensors::open(model), load_model_config(model)));
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 7 % 48);  // vocab 48
  const std::string data = (dir.path() / "tokens.npy").string();
  write_npy_tokens(data, tokens, TokenDType::i32);
  TrainConfig c = config_of({"tiny", true, DType::f32, "none", 2, 16, false});
  c.model_dir = model;
  c.data_file = data;
  const TrainSummary s = run_training(c, RunControl{});
  expect_within_10_percent(s.memory_plan, "fused experts, f32 LoRA");
  EXPECT_EQ(s.memory_plan.at("weights").at("predicted").get<size_t>(),
            s.memory_plan.at("weights").at("measured").get<size_t>());
  set_num_threads(0);
}

// 4096 tokens for the fixtures' vocabulary of 64, in `dir`; the file's path.
std::string vocab64_tokens(const TempDir& dir) {
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 7 % 64);
  const std::string data = (dir.path() / "tokens.npy").string();
  write_npy_tokens(data, tokens, TokenDType::i32);
  return data;
}

// Checkpoints shipped at low width (the int4 and FP8 family fixtures): a
// LoRA run keeps their routed experts' codes and f32 scales and dequantizes
// their other low-width matrices; the plan counts both.
TEST(MemoryPlan, CheckpointsShippedAtLowWidthArePlannedAsRead) {
  set_num_threads(1);
  TempDir dir;
  const std::string data = vocab64_tokens(dir);
  for (const char* family : {"qwen3_moe_int4", "deepseek_v3_fp8", "minimax_m2_fp8"}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      TrainConfig c = config_of({"tiny", true, dt, "none", 2, 16, false});
      c.model_dir = std::string(TIERMOE_TEST_DATA_DIR) + "/families/" + family;
      c.data_file = data;
      if (std::string(family) == "deepseek_v3_fp8") {
        c.lora->targets = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"};
      }
      const TrainSummary s = run_training(c, RunControl{});
      expect_within_10_percent(s.memory_plan, str_of(family, ", ", dtype_name(dt), " LoRA"));
    }
  }
  set_num_threads(0);
}

// With the device tier (a CPU device, every expert placed there), the plan's
// `device` is the workspace and the experts as the device holds them: at
// their stored width for experts quantized at load and for the int4, FP8 and
// MXFP4 checkpoints; with a budget one byte short of that, one expert fewer.
TEST(MemoryPlan, LowWidthExpertsOnTheDeviceTierArePlannedAsHeld) {
  set_num_threads(1);
  TempDir dir;
  const std::string data = vocab64_tokens(dir);
  const std::string fixtures = std::string(TIERMOE_TEST_DATA_DIR);
  for (const std::string model :
       {std::string(), fixtures + "/families/qwen3_moe_int4",
        fixtures + "/families/deepseek_v3_fp8", fixtures + "/families/minimax_m2_fp8",
        fixtures + "/mxfp4/model"}) {
    TrainConfig c = config_of({"tiny", true, DType::bf16, "none", 2, 16, false});
    if (model.empty()) {
      c.experts = QuantFormat::int4;
      c.experts_group = 32;
    } else {
      c.preset.clear();
      c.model_dir = model;
      c.data_file = data;
      c.lora->targets = {"o_proj"};
    }
    c.tier.device = "cpu";
    c.tier.device_threads = 1;
    c.tier.placement = "device";
    c.tier.cost = testing::fast_device_cost();
    c.tier.device_memory = int64_t(64) << 20;
    const std::string what = model.empty() ? "tiny --experts int4" : model;
    const TrainSummary all = run_training(c, RunControl{});
    expect_within_10_percent(all.memory_plan, what);
    const int64_t held = all.memory_plan.at("device").at("measured").get<int64_t>();
    c.tier.device_memory = held - 1;
    const TrainSummary short_one = run_training(c, RunControl{});
    expect_within_10_percent(short_one.memory_plan, what + ", one byte short");
    EXPECT_EQ(short_one.tier.at("resident").get<int64_t>(),
              all.tier.at("resident").get<int64_t>() - 1)
        << what;
  }
  set_num_threads(0);
}

// Refused before the model is built: the log has the plan and nothing after it.
TEST(MemoryPlan, ARunThatCannotFitIsRefusedBeforeLoadingWithWhatWouldFit) {
  TrainConfig c = config_of({"tiny", false, DType::f32, "none", 8, 64});
  const size_t need = plan_memory(c, preset("tiny")).total();
  std::ostringstream log;
  RunControl control;
  control.log = &log;
  control.max_memory = need - 1;
  try {
    run_training(c, control);
    FAIL() << "a run over --max-memory was not refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("more than --max-memory"), std::string::npos) << what;
    EXPECT_NE(std::string(e.hint()).find("it would fit with"), std::string::npos) << e.hint();
  }
  EXPECT_NE(log.str().find("memory plan"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("train: "), std::string::npos) << "the model was built: " << log.str();
  // With room for the plan and the built-in corpus it runs; one byte less
  // refuses the corpus, naming --corpus-tokens.
  control.max_memory = need + data_bytes(c);
  c.trainer.steps = 1;
  EXPECT_NO_THROW(run_training(c, control));
  control.max_memory = need + data_bytes(c) - 1;
  try {
    run_training(c, control);
    FAIL() << "the corpus past --max-memory was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.hint()).find("--corpus-tokens"), std::string::npos) << e.hint();
  }
}

// Experts kept at int4 or int8 are planned as their codes and scales, with
// no packed copies, within 10% of the measured peaks; a LoRA run that fits
// only so is refused naming --experts int4.
TEST(MemoryPlan, QuantizedExpertsArePlannedAsTheirCodes) {
  set_num_threads(1);
  for (QuantFormat f : {QuantFormat::int4, QuantFormat::int8}) {
    TrainConfig c = config_of({"small", true, DType::bf16, "none", 2, 128, false});
    c.experts = f;
    c.experts_group = 32;
    const TrainSummary s = run_training(c, RunControl{});
    expect_within_10_percent(s.memory_plan, std::string(quant_format_name(f)));
  }
  set_num_threads(0);
  TrainConfig c = config_of({"small", true, DType::bf16, "none", 2, 128, false});
  const size_t widened = plan_memory(c, preset("small")).total();
  TrainConfig q = c;
  q.experts = QuantFormat::int4;
  const size_t int4 = plan_memory(q, preset("small")).total();
  ASSERT_LT(int4, widened);
  RunControl control;
  control.max_memory = (widened + int4) / 2;
  EXPECT_TRUE(throws_error_with([&] { run_training(c, control); },
                                {"more than --max-memory", "--experts int4"}));
}

TEST(MemoryPlan, NothingFitsSaysSo) {
  TrainConfig c = config_of({"small", true, DType::f32, "none", 1, 16});
  RunControl control;
  control.max_memory = 1024;
  EXPECT_TRUE(throws_error_with([&] { run_training(c, control); },
                                {"more than --max-memory 1024", "no single change"}));
}

}  // namespace
}  // namespace tiermoe
