// tiermoe train against mistakes, kills, full disks and divergence: a
// resumed NaN optimizer state writes no checkpoint, a huge --lr stops as
// diverged, a second run on a busy --out is refused while a killed run's
// lock blocks nobody, killed runs' leftovers are cleaned up (an aside copy
// of final/ put back), --keep-last, and --profile-out on a full disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "cli/cli_fixture.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

// Runs `tiermoe <args>` as on a full disk: every write to a file fails
// (RLIMIT_FSIZE 0: EFBIG, SIGXFSZ ignored), the failure a writer meets on a
// full disk (ENOSPC) without needing one. Its output comes through a pipe,
// which the limit does not cut.
RunResult run_on_a_full_disk(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = argv_of(args);
  std::vector<char*> argv = pointers(argv_s);
  int out[2];
  if (::pipe(out) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit none{0, 0};
    ::setrlimit(RLIMIT_FSIZE, &none);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  RunResult r;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) r.err.append(buf, size_t(n));
  ::close(out[0]);
  r.rc = wait_exit(pid);
  return r;
}

using CliTrainGuard = Cli;

// A NaN in an adapter is named with its file and tensor when it is loaded,
// not found steps later as "training diverged".
TEST_F(CliTrainGuard, ANanInALoraInitAdapterIsNamedAtLoad) {
  ASSERT_EQ(run(quick({"--steps", "1", "--lora-rank", "2", "--out", path("a").string()})).rc, 0);
  const fs::path weights = path("a") / "adapter" / "adapter_model.safetensors";
  NamedTensors tensors;
  {
    const SafetensorsFile f = SafetensorsFile::open(weights.string());
    for (const SafetensorsEntry& e : f.entries()) {
      tensors.emplace_back(e.name, f.load(e.name, f.view(e.name).dtype()));
    }
  }
  std::string poisoned;
  for (auto& [name, t] : tensors) {
    if (poisoned.empty() && name.ends_with("q_proj.lora_A.weight")) {
      t.set(3, std::nan(""));
      poisoned = name;
    }
  }
  ASSERT_FALSE(poisoned.empty());
  save_safetensors(weights.string(), tensors);
  const RunResult r = run(quick({"--steps", "2", "--lora-init", (path("a") / "adapter").string()}));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(contains(r.err, poisoned + " holds nan (element 3)")) << r.err;
  EXPECT_TRUE(contains(r.err, weights.string())) << r.err;
  EXPECT_FALSE(contains(r.err, "step 1/")) << r.err;
}

TEST_F(CliTrainGuard, ResumingANanOptimizerStateWritesNoCheckpoint) {
  const fs::path out = path("o");
  ASSERT_EQ(run(quick({"--steps", "6", "--stop-after", "2", "--out", out.string()})).rc, 0);
  const fs::path opt = out / "checkpoint-2" / "optimizer.safetensors";
  NamedTensors tensors;
  {
    const SafetensorsFile f = SafetensorsFile::open(opt.string());
    for (const SafetensorsEntry& e : f.entries()) {
      tensors.emplace_back(e.name, f.load(e.name, f.view(e.name).dtype()));
    }
  }
  bool poisoned = false;
  for (auto& [name, t] : tensors) {
    if (name == "lm_head.weight.exp_avg_sq") {
      t.set(0, std::nan(""));
      poisoned = true;
    }
  }
  ASSERT_TRUE(poisoned);
  save_safetensors(opt.string(), tensors);
  const auto before = snapshot(out);

  const RunResult r = run({"train", "--resume", out.string(), "--save-every", "1"});
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(
      contains(r.err, "error: not writing checkpoint-3 at step 3: lm_head.weight holds nan"))
      << r.err;
  EXPECT_EQ(snapshot(out), before) << "no checkpoint was written, the previous one is intact";
}

TEST_F(CliTrainGuard, AHugeLearningRateStopsAsDivergedNamingTheStep) {
  for (const std::string opt : {"adamw", "sgd"}) {
    const RunResult r = run(quick({"--steps", "40", "--lr", "1e6", "--optimizer", opt}));
    EXPECT_EQ(r.rc, 1) << opt << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "error: training diverged at step ")) << opt << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "--divergence-patience")) << r.err;
    const RunResult off = run(
        quick({"--steps", "40", "--lr", "1e6", "--optimizer", opt, "--divergence-patience", "0"}));
    EXPECT_EQ(off.rc, 0) << opt << ": " << off.err;
  }
  const RunResult bad = run(quick({"--steps", "2", "--divergence-factor", "0.5"}));
  EXPECT_EQ(bad.rc, 1) << bad.err;
  EXPECT_TRUE(contains(bad.err, "--divergence-factor")) << bad.err;
}

TEST_F(CliTrainGuard, ASecondRunOnABusyOutIsRefusedAndAKilledRunBlocksNobody) {
  const fs::path out = path("o");
  const pid_t first =
      spawn(quick({"--steps", "1000000", "--progress-every", "1", "--out", out.string()}),
            path("first.log"));
  ASSERT_GT(first, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!contains(slurp(path("first.log")), "step 1/") &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const RunResult second = run(quick({"--steps", "3", "--out", out.string()}));
  EXPECT_EQ(second.rc, 1) << second.err;
  EXPECT_TRUE(contains(second.err, "error: another tiermoe run (pid " + std::to_string(first) +
                                       ") is writing to this output directory"))
      << second.err;
  EXPECT_TRUE(contains(second.err, out.string())) << second.err;

  ::kill(first, SIGKILL);
  wait_exit(first);
  ASSERT_TRUE(fs::exists(out / ".tiermoe.lock")) << "the killed run's lock file stays";
  const RunResult third = run(quick({"--steps", "2", "--out", out.string()}));
  EXPECT_EQ(third.rc, 0) << third.err;
  EXPECT_EQ(testing::dir_entries(out), (std::set<std::string>{"checkpoint-2", "final"}));
}

TEST_F(CliTrainGuard, KilledRunsLeftoversAreRemovedAndAnAsideFinalPutBack) {
  const fs::path out = path("o");
  ASSERT_EQ(run(quick({"--steps", "4", "--save-every", "2", "--out", out.string()})).rc, 0);
  const auto final_files = snapshot(out / "final");
  // As a kill leaves them: final/ renamed aside with the new one not yet in
  // place, and a checkpoint half written.
  fs::rename(out / "final", out / ".final.old-4000001");
  fs::create_directories(out / ".checkpoint-6.tmp-4000002");
  std::ofstream(out / ".checkpoint-6.tmp-4000002" / "model.safetensors") << std::string(5000, 'x');

  const RunResult r =
      run({"train", "--resume", (out / "checkpoint-2").string(), "--stop-after", "3"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "removed 1 temporary directory")) << r.err;
  EXPECT_TRUE(contains(r.err, "restored " + (out / "final").string())) << r.err;
  EXPECT_EQ(testing::dir_entries(out),
            (std::set<std::string>{"checkpoint-2", "checkpoint-3", "checkpoint-4", "final"}));
  EXPECT_EQ(snapshot(out / "final"), final_files);
}

TEST_F(CliTrainGuard, KeepLastKeepsTheNewestCheckpoints) {
  const fs::path out = path("o");
  const RunResult r =
      run(quick({"--steps", "5", "--save-every", "1", "--keep-last", "2", "--out", out.string()}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(testing::dir_entries(out), (std::set<std::string>{"checkpoint-4", "checkpoint-5", "final"}));
  const RunResult bad = run(quick({"--steps", "2", "--keep-last", "-1", "--out", out.string()}));
  EXPECT_NE(bad.rc, 0);
  EXPECT_TRUE(contains(bad.err, "--keep-last")) << bad.err;
}

TEST_F(CliTrainGuard, ProfileOutOnAFullDiskLeavesNoFile) {
  const fs::path profile = path("p.json");
  const RunResult r =
      run_on_a_full_disk(quick({"--steps", "2", "--device", "cpu", "--device-memory", "8MiB",
                                "--profile-out", profile.string()}));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "error: write failed")) << r.err;
  EXPECT_TRUE(contains(r.err, profile.string())) << r.err;
  EXPECT_FALSE(fs::exists(profile));
  EXPECT_FALSE(fs::exists(profile.string() + ".tmp")) << "the temporary file is removed";
}

}  // namespace
}  // namespace tiermoe
