// Whole training runs with the device tier on a CpuDevice against the same
// runs on the host alone: every loss and the exported weights bitwise, for
// LoRA and full fine-tuning, absorbed scores and not, f32 and f64, across
// steps in which the placement changes; and injected device faults (an
// out-of-memory while moving experts, a failed launch) that must not change
// a single bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "common/tier_runs.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

class TierTraining : public testing::TrainingRunTest {
 protected:
  TierTraining() : TrainingRunTest("tiermoe_tier_training_") {}
  // The exported weights (final/ or adapter/) of a run, every file's bytes.
  std::string exported(const TrainSummary& s) {
    std::string all;
    for (const auto& e : fs::directory_iterator(s.final_export)) {
      if (e.path().extension() == ".safetensors") all += read_bytes(e.path());
    }
    EXPECT_FALSE(all.empty());
    return all;
  }
};

struct Case {
  DType dtype;
  bool lora;
  const char* absorb;
  const char* preset = "tiny";
};

TEST_F(TierTraining, DevicePathEqualsHostPathBitwise) {
  for (const Case& k :
       {Case{DType::f64, false, "auto"}, Case{DType::f32, false, "off"},
        Case{DType::f32, true, "auto"}, Case{DType::f64, true, "off"},
        Case{DType::bf16, false, "auto"}, Case{DType::f32, false, "auto", "tiny-qwen2-moe"}}) {
    const std::string what = std::string(k.preset) + "_" + std::string(dtype_name(k.dtype)) +
                             (k.lora ? "_lora" : "_full") + "_absorb_" + k.absorb;
    const TrainConfig host_cfg = testing::tiny_tier_run(k.dtype, k.lora, k.absorb, k.preset);
    TrainConfig tier_cfg = host_cfg;
    tier_cfg.tier = testing::moving_device_tier(tier_cfg, "cpu", profile_);
    const TrainSummary host = train(host_cfg, "host_" + what);
    const TrainSummary tiered = train(tier_cfg, "tier_" + what);

    ASSERT_EQ(host.losses.size(), tiered.losses.size()) << what;
    for (size_t i = 0; i < host.losses.size(); ++i) {
      EXPECT_EQ(host.losses[i], tiered.losses[i]) << what << " step " << i + 1;
    }
    EXPECT_TRUE(exported(host) == exported(tiered)) << what << ": exported weights differ";
    // The device did real work, and the placement moved during the run.
    EXPECT_GT(tiered.tier.at("hot_fraction").get<double>(), 0.1) << what;
    EXPECT_GT(tiered.tier.at("device_calls").get<int64_t>(), 0) << what;
    EXPECT_GE(tiered.tier.at("replacements").get<int64_t>(), 1) << what;
    EXPECT_GT(tiered.tier.at("bytes_moved").get<size_t>(), 0) << what;
    if (!k.lora) {
      EXPECT_GT(tiered.tier.at("bytes_synced").get<size_t>(), 0) << what;
    }
    // The checkpoint carries the routing profile.
    EXPECT_TRUE(fs::exists(fs::path(tiered.last_checkpoint) / "routing_profile.json")) << what;
  }
}

// A LoRA run from a bf16 checkpoint in f32 keeps the frozen experts at bf16
// (mapped from the shard, train/trainer_config.h): the device holds them
// widened and must still give the host's bits.
TEST_F(TierTraining, StoredWidthExpertsOnTheDeviceEqualTheHostBitwise) {
  const TrainConfig base = testing::tiny_tier_run(DType::f32, true, "auto");
  TrainConfig init = base;
  init.dtype = DType::bf16;
  init.lora.reset();
  build_model(init).save_checkpoint((dir_ / "bf16").string(), DType::bf16);
  TrainConfig host_cfg = base;
  host_cfg.model_dir = (dir_ / "bf16").string();
  TrainConfig tier_cfg = host_cfg;
  tier_cfg.tier = testing::moving_device_tier(tier_cfg, "cpu", profile_);
  const TrainSummary host = train(host_cfg, "host");
  const TrainSummary tiered = train(tier_cfg, "tier");
  ASSERT_EQ(host.losses.size(), tiered.losses.size());
  for (size_t i = 0; i < host.losses.size(); ++i) {
    EXPECT_EQ(host.losses[i], tiered.losses[i]) << "step " << i + 1;
  }
  EXPECT_TRUE(exported(host) == exported(tiered));
  EXPECT_GT(tiered.tier.at("device_calls").get<int64_t>(), 0);
  EXPECT_GT(host.memory_peak[size_t(MemTag::mapped)], 0u);  // the experts were mapped, at bf16
}

// LoRA over frozen low-width experts: int4 quantized at load (the tiny
// preset) and gpt-oss's MXFP4 as shipped (the transformers fixture). The
// device holds each resident expert's stored bytes (tier/device.h's
// images), with room for a third of the experts, and the placement follows
// the routing: the host's losses and adapter bitwise, and the budget holds
// more experts than it would widened.
TEST_F(TierTraining, QuantizedExpertsOnTheDeviceEqualTheHostBitwise) {
  TrainConfig int4 = testing::tiny_tier_run(DType::bf16, true, "auto");
  int4.experts = QuantFormat::int4;
  int4.experts_group = 32;
  TrainConfig mxfp4 = testing::tiny_tier_run(DType::f32, true, "auto");
  mxfp4.preset.clear();
  mxfp4.model_dir = std::string(TIERMOE_TEST_DATA_DIR) + "/mxfp4/model";
  std::vector<int32_t> tokens(4096);  // its vocabulary is 64
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + i / 7) % 64);
  mxfp4.data_file = (dir_ / "tokens.npy").string();
  write_npy_tokens(mxfp4.data_file, tokens, TokenDType::i32);
  for (const auto& [what, host_cfg] : {std::pair{"int4", int4}, std::pair{"mxfp4", mxfp4}}) {
    const CausalLM model = build_model(host_cfg);
    const std::optional<ExpertQuant> quant = model.expert_quant();
    ASSERT_TRUE(quant) << what;
    const ModelConfig& m = model.config();
    ExpertShape held = expert_shape(m, host_cfg.dtype);
    held.quant = quant;
    const int64_t room = model.num_moe_layers() * m.num_experts / 3;
    TrainConfig tier_cfg = host_cfg;
    tier_cfg.tier = testing::following_the_routing(
        testing::device_tier_with_room(held, TrainMode::lora, "cpu", room, "auto"), "");
    const TrainSummary host = train(host_cfg, std::string("host_") + what);
    const TrainSummary tiered = train(tier_cfg, std::string("tier_") + what);
    ASSERT_EQ(host.losses.size(), tiered.losses.size()) << what;
    for (size_t i = 0; i < host.losses.size(); ++i) {
      EXPECT_EQ(host.losses[i], tiered.losses[i]) << what << " step " << i + 1;
    }
    EXPECT_TRUE(exported(host) == exported(tiered)) << what;
    EXPECT_GT(tiered.tier.at("device_calls").get<int64_t>(), 0) << what;
    EXPECT_GE(tiered.tier.at("replacements").get<int64_t>(), 2) << what;
    EXPECT_EQ(tiered.tier.at("resident").get<int64_t>(), room) << what;
    // Widened, the same budget would hold fewer than half as many.
    ExpertShape widened = held;
    widened.quant.reset();
    EXPECT_GT(bytes_resident(widened, TrainMode::lora), 2 * bytes_resident(held, TrainMode::lora))
        << what;
  }
}

TEST_F(TierTraining, ResumeWithTheTierPlacesFromTheCheckpointsProfile) {
  const TrainConfig host_cfg = testing::tiny_tier_run(DType::f32, false, "auto");
  const TrainSummary host = train(host_cfg, "host");
  TrainConfig cfg = host_cfg;
  cfg.tier = testing::moving_device_tier(cfg, "cpu", /*profile_in=*/"");
  RunControl first{.out_dir = (dir_ / "split").string(), .stop_after = 3};
  run_training(cfg, first);
  const std::string metrics = (dir_ / "resumed.jsonl").string();
  RunControl second{.out_dir = (dir_ / "split").string(),
                    .resume = (dir_ / "split" / "checkpoint-3").string(),
                    .metrics_file = metrics};
  const TrainSummary resumed = run_training(cfg, second);
  ASSERT_EQ(resumed.losses.size(), host.losses.size());
  for (size_t i = 0; i < host.losses.size(); ++i) {
    EXPECT_EQ(host.losses[i], resumed.losses[i]) << "step " << i + 1;
  }
  EXPECT_TRUE(exported(host) == exported(resumed));
  // The checkpoint's profile placed experts before the resumed run's first
  // step (step 4), so the device worked in it already.
  std::ifstream lines(metrics);
  std::string first_line;
  ASSERT_TRUE(std::getline(lines, first_line));
  const nlohmann::json step4 = nlohmann::json::parse(first_line);
  EXPECT_EQ(step4.at("step").get<int64_t>(), 4);
  EXPECT_GT(step4.at("tier").at("hot_fraction").get<double>(), 0.0);
  EXPECT_GE(step4.at("tier").at("replacements").get<int64_t>(), 1);
}

TEST_F(TierTraining, DeviceFaultsChangeNoResult) {
  const TrainConfig host_cfg = testing::tiny_tier_run(DType::f32, false, "auto");
  const TrainSummary host = train(host_cfg, "host");
  struct Fault {
    const char* name;
    DeviceFaults faults;
  };
  // Counted from when the tier is built (its workspace is allocated by then):
  // allocation 3 is the second expert moving in (weights, then gradient
  // sums, each). Launch 40 falls in the first steps.
  for (const Fault& f : {Fault{"oom", {.fail_alloc = 3}}, Fault{"launch", {.fail_launch = 40}}}) {
    TrainConfig cfg = host_cfg;
    cfg.tier = testing::moving_device_tier(cfg, "cpu", profile_);
    cfg.tier.faults = f.faults;
    const TrainSummary tiered = train(cfg, std::string("tier_") + f.name);
    for (size_t i = 0; i < host.losses.size(); ++i) {
      EXPECT_EQ(host.losses[i], tiered.losses[i]) << f.name << " step " << i + 1;
    }
    EXPECT_TRUE(exported(host) == exported(tiered)) << f.name;
    EXPECT_EQ(tiered.tier.at("faults").get<int64_t>(), 1) << f.name;
    EXPECT_GT(tiered.tier.at("hot_fraction").get<double>(), 0.0) << f.name;
  }
}

}  // namespace
}  // namespace tiermoe
