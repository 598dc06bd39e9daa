// Checkpoints of an expert-parallel run: written once by all ranks together
// (one Hugging Face sharded checkpoint, an optimizer file per rank), the
// final export equal to a one-rank run's tensor by tensor, and resumable on
// any rank count: the ranks resume their own checkpoint, one rank resumes
// it, and the ranks resume a one-rank checkpoint, each continuing with the
// losses of the run that never stopped.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/testing.h"
#include "ep/ep_env.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/train/checkpoint.h"
#include "tiermoe/train/trainer_session.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;
using testing::all_ranks;
using testing::ep_comm;

TrainConfig tiny_run(bool lora) {
  TrainConfig c;
  c.preset = "tiny";
  c.dtype = DType::f32;
  c.seed = 3;
  c.corpus_tokens = 4096;
  c.trainer.steps = 4;
  c.trainer.batch = 2;
  c.trainer.seq_len = 16;
  c.trainer.grad_accum = 2;
  c.trainer.schedule.base_lr = 1e-2;
  c.trainer.schedule.warmup_steps = 0;
  c.trainer.data_seed = c.seed;
  if (lora) {
    LoraConfig l;
    l.targets = parse_lora_targets("q_proj,o_proj,gate_proj,down_proj");
    c.lora = l;
  }
  return c;
}

class EpCheckpoint : public testing::EpDirTest<::testing::TestWithParam<bool>> {
 protected:
  EpCheckpoint() : EpDirTest("tiermoe_ep_checkpoint_") {}

  // A run over the job's ranks (comm) or on this rank alone (nullptr).
  TrainSummary train(const TrainConfig& c, const std::string& out, Comm* comm,
                     const std::string& resume = "", int64_t stop_after = 0) {
    RunControl control;
    control.comm = comm;
    control.out_dir = (dir_ / out).string();
    control.save_every = 2;
    control.stop_after = stop_after;
    control.resume = resume.empty() ? "" : resolve_checkpoint((dir_ / resume).string());
    return run_training(c, control);
  }

  // Every tensor of two checkpoint (or adapter) directories, bitwise.
  static ::testing::AssertionResult same_tensors(const fs::path& a, const fs::path& b,
                                                 const char* single_file = nullptr) {
    CheckpointTensors x = single_file ? CheckpointTensors::open((a / single_file).string())
                                      : CheckpointTensors::open(a.string());
    CheckpointTensors y = single_file ? CheckpointTensors::open((b / single_file).string())
                                      : CheckpointTensors::open(b.string());
    if (x.names() != y.names()) return ::testing::AssertionFailure() << "tensor names differ";
    for (const std::string& n : x.names()) {
      if (x.entry(n).dtype != y.entry(n).dtype) {
        return ::testing::AssertionFailure()
               << n << ": stored as " << x.entry(n).dtype << " and " << y.entry(n).dtype;
      }
      auto r = testing::bitwise_equal(x.view(n), y.view(n), n);
      if (!r) return r;
    }
    return ::testing::AssertionSuccess() << x.names().size() << " tensors";
  }
};

TEST_P(EpCheckpoint, WrittenOnceAndResumedOnAnyRankCount) {
  const bool lora = GetParam();
  Comm& comm = ep_comm();
  const int P = comm.size(), me = comm.rank();
  const TrainConfig c = tiny_run(lora);

  // The run that never stops, on one rank (rank 0 alone) and on the ranks.
  TrainSummary one;
  if (me == 0) one = train(c, "one", nullptr);
  comm.barrier("one-rank run");
  const TrainSummary ep = train(c, "ep", &comm);
  EXPECT_EQ(ep.losses.size(), 4u);
  bool ok = true;
  if (me == 0) {
    EXPECT_EQ(ep.losses, one.losses);
    ok &= ep.losses == one.losses;
    // One directory per checkpoint, the ranks' parts in it.
    const fs::path ck = dir_ / "ep" / "checkpoint-2";
    EXPECT_TRUE(fs::exists(ck / kTrainerStateFile));
    for (int r = 0; r < P; ++r) {
      char name[64];
      std::snprintf(name, sizeof name, "optimizer-%05d-of-%05d.safetensors", r + 1, P);
      EXPECT_TRUE(fs::exists(ck / name)) << name;
    }
    if (!lora) {
      EXPECT_TRUE(fs::exists(ck / "model.safetensors.index.json"));
    }
    // The final export holds every tensor, equal to the one-rank run's.
    const char* file = lora ? "adapter_model.safetensors" : nullptr;
    auto same = same_tensors(dir_ / "ep" / (lora ? "adapter" : "final"),
                             dir_ / "one" / (lora ? "adapter" : "final"), file);
    EXPECT_TRUE(same);
    ok &= bool(same);
    same = same_tensors(dir_ / "ep" / "checkpoint-4", dir_ / "one" / "checkpoint-4",
                        lora ? "adapter_model.safetensors" : nullptr);
    EXPECT_TRUE(same);
    ok &= bool(same);
  }
  EXPECT_TRUE(all_ranks(ok));

  // The ranks resume their checkpoint; one rank resumes it; the ranks resume one rank's.
  const TrainSummary ep_from_ep = train(c, "ep", &comm, "ep/checkpoint-2");
  TrainSummary one_from_ep;
  if (me == 0) {
    fs::create_directories(dir_ / "one_from_ep");
    fs::copy(dir_ / "ep" / "checkpoint-2", dir_ / "one_from_ep" / "checkpoint-2",
             fs::copy_options::recursive);
    one_from_ep = train(c, "one_from_ep", nullptr, "one_from_ep/checkpoint-2");
    fs::create_directories(dir_ / "ep_from_one");
    fs::copy(dir_ / "one" / "checkpoint-2", dir_ / "ep_from_one" / "checkpoint-2",
             fs::copy_options::recursive);
  }
  comm.barrier("one rank resumed");
  const TrainSummary ep_from_one = train(c, "ep_from_one", &comm, "ep_from_one/checkpoint-2");
  if (me == 0) {
    EXPECT_EQ(ep_from_ep.losses, one.losses);
    EXPECT_EQ(one_from_ep.losses, one.losses);
    EXPECT_EQ(ep_from_one.losses, one.losses);
  }
}

INSTANTIATE_TEST_SUITE_P(, EpCheckpoint, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "lora_on_experts" : "full");
                         });

}  // namespace
}  // namespace tiermoe
