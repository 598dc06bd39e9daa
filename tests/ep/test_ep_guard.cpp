// The --out guards under expert parallelism: a non-finite state on one
// rank stops the checkpoint on every rank before any of them writes (the
// verdict is shared), and rank 0 alone cleans up killed runs' leftovers and
// prunes to --keep-last while every rank writes its part.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "common/test_dir.h"
#include "ep/ep_env.h"
#include "tiermoe/core/error.h"
#include "tiermoe/train/checkpoint.h"
#include "tiermoe/train/trainer_session.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;
using testing::all_ranks;
using testing::ep_comm;

TrainConfig tiny_run() {
  TrainConfig c;
  c.preset = "tiny";
  c.dtype = DType::f32;
  c.seed = 4;
  c.corpus_tokens = 4096;
  c.trainer.steps = 4;
  c.trainer.batch = 2;
  c.trainer.seq_len = 16;
  c.trainer.grad_accum = 2;
  c.trainer.schedule.warmup_steps = 0;
  c.trainer.data_seed = c.seed;
  return c;
}

class EpGuard : public testing::EpDirTest<> {
 protected:
  EpGuard() : EpDirTest("tiermoe_ep_guard_") {}
};

TEST_F(EpGuard, ANonFiniteExpertOnOneRankStopsTheCheckpointOnEveryRank) {
  Comm& comm = ep_comm();
  const TrainConfig c = tiny_run();
  CausalLM model = build_model(c, &comm);
  const auto rows = build_data(c, model.config());
  Trainer trainer(model, *rows, c.trainer);
  trainer.step();
  const std::string out = (dir_ / "out").string();
  save_train_checkpoint(out, model, trainer, c);

  // Rank 1's first expert's second moment goes NaN; the update spreads it
  // to that expert's weight, which only rank 1 holds.
  if (comm.rank() == 1) {
    bool poisoned = false;
    for (auto& [name, t] : trainer.optimizer().state_tensors()) {
      if (!poisoned && name.find(".mlp.experts.") != std::string::npos &&
          name.ends_with(".exp_avg_sq")) {
        Tensor v = t;
        v.set(0, std::nan(""));
        poisoned = true;
      }
    }
    EXPECT_TRUE(poisoned);
  }
  trainer.step();
  std::string err;
  try {
    save_train_checkpoint(out, model, trainer, c);
  } catch (const Error& e) {
    err = e.what();
  }
  const bool named = err.find("not writing checkpoint-2 at step 2: model.layers.") == 0 &&
                     err.find(".mlp.experts.4.") != std::string::npos &&
                     err.find("holds nan (element 0) on rank 1") != std::string::npos;
  EXPECT_TRUE(named) << err;
  EXPECT_TRUE(all_ranks(named));
  comm.barrier("checked");
  if (comm.rank() == 0) {
    EXPECT_EQ(testing::dir_entries(out), std::set<std::string>{"checkpoint-1"});
  }
}

TEST_F(EpGuard, RankZeroCleansUpAndKeepsTheLastCheckpoints) {
  Comm& comm = ep_comm();
  const fs::path out = dir_ / "out";
  if (comm.rank() == 0) {
    fs::create_directories(out / ".checkpoint-7.tmp-4000003");
    std::ofstream(out / ".checkpoint-7.tmp-4000003" / "model-00002-of-00002.safetensors") << "x";
  }
  comm.barrier("leftovers made");
  const TrainSummary s = run_training(
      tiny_run(), {.comm = &comm, .out_dir = out.string(), .save_every = 1, .keep_last = 2});
  EXPECT_EQ(s.steps, 4);
  comm.barrier("run done");
  if (comm.rank() == 0) {
    EXPECT_EQ(testing::dir_entries(out), (std::set<std::string>{"checkpoint-3", "checkpoint-4", "final"}));
    EXPECT_TRUE(fs::exists(out / "checkpoint-4" / "optimizer-00002-of-00002.safetensors"));
  }
}

}  // namespace
}  // namespace tiermoe
