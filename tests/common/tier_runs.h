#pragma once
// Shared by the whole-run tests of the device tier (tests/tier, tests/cuda,
// tests/ep): the tiny training run they compare, a device tier sized to hold
// a few experts with rates that make the placement follow the routing, and a
// fixture that gives each test its own directory and a deliberately wrong
// routing profile.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/test_dir.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/routing_profile.h"
#include "tiermoe/train/trainer_session.h"

namespace tiermoe::testing {

// The tiny preset, 6 steps of 4 x 16 tokens at lr 3e-3. LoRA on the
// attention projections: the experts stay frozen.
inline TrainConfig tiny_tier_run(DType dtype, bool lora, const std::string& absorb = "auto",
                                 const std::string& preset = "tiny") {
  TrainConfig c;
  c.preset = preset;
  c.dtype = dtype;
  c.seed = 11;
  c.corpus_tokens = 4096;
  c.absorb = absorb;
  c.trainer.steps = 6;
  c.trainer.batch = 4;
  c.trainer.seq_len = 16;
  c.trainer.schedule.base_lr = 3e-3;
  c.trainer.schedule.warmup_steps = 0;
  if (lora) c.lora = LoraConfig{};
  return c;
}

// A device 100x faster than the host on a fast link: the planner always
// wants experts there, so the budget decides how many.
inline CostModel fast_device_cost() {
  CostModel cost;
  cost.host_flops_per_s = 1e9;
  cost.device_flops_per_s = 1e11;
  cost.link_bytes_per_s = 1e10;
  cost.launch_s = 1e-6;
  cost.buckets = bucket_ladder(16, ExpertsConfig{}.dw_row_block);
  return cost;
}

// `device` ("cpu" or "cuda") with room for the workspace and `experts`
// resident experts of `shape` (as the device holds them), under `placement`
// and fast_device_cost().
inline TierRunConfig device_tier_with_room(const ExpertShape& shape, TrainMode mode,
                                           const std::string& device, int64_t experts,
                                           const std::string& placement) {
  TierRunConfig t;
  t.device = device;
  t.device_memory = bytes_workspace(shape, ExpertsConfig{}.dw_row_block) +
                    size_t(experts) * bytes_resident(shape, mode);
  t.placement = placement;
  if (device == "cpu") t.device_threads = 1;
  t.cost = fast_device_cost();
  return t;
}

// The same for `run`'s preset shapes.
inline TierRunConfig small_device_tier(const TrainConfig& run, const std::string& device,
                                       int experts, const std::string& placement) {
  const ModelConfig m = preset(run.preset);
  const ExpertShape shape{m.hidden_size, m.moe_intermediate_size, run.dtype};
  return device_tier_with_room(shape, run.lora ? TrainMode::lora : TrainMode::full, device, experts,
                               placement);
}

// `t` with a planner that re-places on any gain: the placement follows the
// routing from `profile_in` (none when empty) as it settles.
inline TierRunConfig following_the_routing(TierRunConfig t, const std::string& profile_in) {
  t.horizon_steps = 1'000'000;  // any gain pays for a move...
  t.min_gain = 0.0;             // ... so the placement follows the routing
  t.profile_decay = 0.5;
  t.profile_in = profile_in;
  return t;
}

// small_device_tier with 5 of the tiny preset's 16 experts under `auto`,
// following the routing.
inline TierRunConfig moving_device_tier(const TrainConfig& run, const std::string& device,
                                        const std::string& profile_in) {
  return following_the_routing(small_device_tier(run, device, 5, "auto"), profile_in);
}

// Each test in its own directory under the temp dir (named after the test),
// with a routing profile of the tiny preset that is wrong on purpose (hot
// experts in reverse), so a first placement from it must be corrected.
class TrainingRunTest : public DirTest {
 protected:
  explicit TrainingRunTest(std::string prefix) : DirTest(std::move(prefix), 2) {}
  void SetUp() override {
    DirTest::SetUp();
    RoutingProfile wrong = RoutingProfile::synthetic(2, 8, 128, 1.5, /*seed=*/99);
    profile_ = (dir_ / "wrong_profile.json").string();
    wrong.save(profile_);
  }
  TrainSummary train(const TrainConfig& c, const std::string& name) {
    RunControl control;
    control.out_dir = (dir_ / name).string();
    return run_training(c, control);
  }

  std::string profile_;
};

}  // namespace tiermoe::testing
