// What a run refuses to do to its --out directory: a checkpoint of
// non-finite weights or optimizer state is never written (the previous one
// stays), a run that diverged while staying finite stops naming the step,
// two runs never share a directory, and --keep-last keeps the newest.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/test_dir.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/train/checkpoint.h"
#include "tiermoe/train/out_dir.h"
#include "tiermoe/train/trainer_session.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

TrainConfig tiny_run(int64_t steps, double lr = 3e-3) {
  TrainConfig c;
  c.preset = "tiny";
  c.layers = 1;
  c.seed = 5;
  c.corpus_tokens = 4096;
  c.trainer.steps = steps;
  c.trainer.batch = 2;
  c.trainer.seq_len = 16;
  c.trainer.schedule.base_lr = lr;
  c.trainer.schedule.warmup_steps = 0;
  c.trainer.data_seed = c.seed;
  return c;
}

class RunGuards : public testing::DirTest {
 protected:
  RunGuards() : DirTest("tiermoe_test_run_guards_", 1) {}
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The optimizer state's view of `name` (it aliases the live state).
Tensor state_of(const Trainer& t, const std::string& name) {
  for (const auto& [n, v] : t.optimizer().state_tensors()) {
    if (n == name) return v;
  }
  ADD_FAILURE() << "no optimizer state " << name;
  return {};
}

TEST_F(RunGuards, ANonFiniteStateIsNeverCheckpointed) {
  const TrainConfig c = tiny_run(4);
  CausalLM model = build_model(c);
  const auto rows = build_data(c, model.config());
  Trainer trainer(model, *rows, c.trainer);
  trainer.step();
  save_train_checkpoint(dir_.string(), model, trainer, c);

  // A NaN in the second moment of lm_head turns lm_head.weight to NaN.
  Tensor v = state_of(trainer, "lm_head.weight.exp_avg_sq");
  v.set(0, std::nan(""));
  trainer.step();
  std::string err = error_of([&] { save_train_checkpoint(dir_.string(), model, trainer, c); });
  EXPECT_NE(err.find("not writing checkpoint-2 at step 2"), std::string::npos) << err;
  EXPECT_NE(err.find("lm_head.weight holds nan (element 0)"), std::string::npos) << err;
  EXPECT_EQ(testing::dir_entries(dir_), std::set<std::string>{"checkpoint-1"});

  // An infinite value in the state alone (weights finite) is refused too.
  v.set(0, 1.0);
  for (ModelParam& p : model.params()) {
    if (p.name == "lm_head.weight") p.value.set(0, 0.5);
  }
  Tensor m = state_of(trainer, "model.norm.weight.exp_avg");
  m.set(3, INFINITY);
  err = error_of([&] { save_train_checkpoint(dir_.string(), model, trainer, c); });
  EXPECT_NE(err.find("model.norm.weight.exp_avg holds inf (element 3)"), std::string::npos) << err;
  EXPECT_EQ(testing::dir_entries(dir_), std::set<std::string>{"checkpoint-1"});
  // The checkpoint kept resumes.
  const TrainSummary resumed =
      run_training(c, {.out_dir = dir_.string(), .resume = (dir_ / "checkpoint-1").string()});
  EXPECT_EQ(resumed.steps, 4);
}

// AdamW and SGD at --lr 1e6 stay finite and learn nothing: the loss pinned
// at chance with a gradient of 0. The default rule stops them; with the
// rule off they run to the end.
TEST_F(RunGuards, AHugeLearningRateStopsAsDiverged) {
  for (const OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd}) {
    TrainConfig c = tiny_run(40, 1e6);
    // As the CLI's defaults: a warmup, no weight decay (1 - lr * wd flips the
    // weights' sign and they overflow to Inf at once, which the NaN guard stops).
    c.trainer.schedule.warmup_steps = 4;
    c.trainer.adamw.weight_decay = c.trainer.sgd.weight_decay = 0;
    c.trainer.optimizer = kind;
    const fs::path out = dir_ / std::string(optimizer_kind_name(kind));
    const std::string err =
        error_of([&] { run_training(c, {.out_dir = out.string(), .save_every = 5}); });
    EXPECT_NE(err.find("training diverged at step 12: "), std::string::npos)
        << optimizer_kind_name(kind) << ": " << err;
    EXPECT_TRUE(fs::exists(out / "checkpoint-10")) << "the checkpoints before it stay";
    EXPECT_FALSE(fs::exists(out / "final")) << "a diverged run exports nothing";
    EXPECT_EQ(testing::dir_entries(out).count(kOutDirLockFile), 0u) << "the lock went with the run";

    const TrainSummary off = run_training(c, {.divergence = {.patience = 0}});
    EXPECT_EQ(off.steps, 40) << optimizer_kind_name(kind);
  }
}

TEST_F(RunGuards, ALockedOutDirIsRefusedBeforeAnyStep) {
  const TrainConfig c = tiny_run(2);
  OutDirLock other((dir_ / "out").string());
  const std::string err = error_of([&] { run_training(c, {.out_dir = (dir_ / "out").string()}); });
  EXPECT_NE(err.find("another tiermoe run (pid "), std::string::npos) << err;
  EXPECT_EQ(testing::dir_entries(dir_ / "out"), std::set<std::string>{kOutDirLockFile}) << "nothing written";
}

TEST_F(RunGuards, KeepLastKeepsTheNewestCheckpointsAndResumes) {
  const TrainConfig c = tiny_run(6);
  RunControl first{.out_dir = dir_.string(), .save_every = 1, .stop_after = 4, .keep_last = 2};
  run_training(c, first);
  EXPECT_EQ(testing::dir_entries(dir_), (std::set<std::string>{"checkpoint-3", "checkpoint-4"}));
  const TrainSummary straight = run_training(c, {});
  RunControl second{.out_dir = dir_.string(),
                    .save_every = 1,
                    .keep_last = 1,
                    .resume = resolve_checkpoint(dir_.string())};
  const TrainSummary resumed = run_training(c, second);
  EXPECT_EQ(resumed.losses, straight.losses);
  EXPECT_EQ(testing::dir_entries(dir_), (std::set<std::string>{"checkpoint-6", "final"}));
  EXPECT_NE(error_of([&] {
              run_training(c, {.out_dir = (dir_ / "x").string(), .keep_last = -2});
            }).find("--keep-last -2"),
            std::string::npos);
}

}  // namespace
}  // namespace tiermoe
