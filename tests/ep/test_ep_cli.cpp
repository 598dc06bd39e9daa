// `mpirun -np 2 tiermoe train --ep 2` as a user runs it: the same losses as
// one process with the same flags, progress and --json from rank 0 alone,
// the all-to-all figures in the summary; and a rank that dies, hangs or
// fails makes the whole job exit non-zero with a message saying so, within
// a bounded time.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "cli/cli_fixture.h"

namespace tiermoe {
namespace {

class EpCli : public Cli {
 protected:
  // `mpirun -np P tiermoe <args>`, or `tiermoe <args>` with P = 0; the
  // seconds it took in `seconds`.
  RunResult run_ranks(int P, const std::vector<std::string>& args, double* seconds = nullptr) {
    std::string cmd = P > 0 ? std::string(TIERMOE_MPIRUN) + " -np " + std::to_string(P) + " " : "";
    cmd += std::string("'") + TIERMOE_CLI_PATH + "'";
    for (const auto& a : args) cmd += " '" + a + "'";
    // A hard bound on the test itself, should the job never end.
    cmd = "timeout -k 5 240 " + cmd;
    cmd += " >'" + path("stdout").string() + "' 2>'" + path("stderr").string() + "'";
    const auto start = std::chrono::steady_clock::now();
    const int status = std::system(cmd.c_str());
    if (seconds) {
      *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    RunResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(path("stdout"));
    r.err = slurp(path("stderr"));
    return r;
  }

  static std::vector<std::string> tiny(std::vector<std::string> more = {},
                                       const std::string& grad_accum = "2") {
    std::vector<std::string> a = {
        "train", "--preset",  "tiny", "--steps",          "4",        "--batch",
        "2",     "--seq-len", "16",   "--grad-accum",     grad_accum, "--corpus-tokens",
        "4096",  "--threads", "1",    "--progress-every", "1"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }
};

TEST_F(EpCli, TwoRanksTrainTheOneRankModel) {
  RunResult one = run_ranks(0, tiny({"--json"}));
  ASSERT_EQ(one.rc, 0) << one.err;
  RunResult two =
      run_ranks(2, tiny({"--ep", "2", "--json", "--metrics", path("m.jsonl").string()}));
  ASSERT_EQ(two.rc, 0) << two.err;
  const nlohmann::json a = last_json_line(one.out), b = last_json_line(two.out);
  EXPECT_EQ(a.at("losses"), b.at("losses"));
  EXPECT_EQ(b.at("ranks"), 2);
  EXPECT_GT(b.at("alltoall_bytes").get<double>(), 0);
  EXPECT_GT(b.at("comm").at("alltoall_bytes_all_ranks").get<double>(),
            b.at("alltoall_bytes").get<double>());
  // Rank 0 alone speaks: one summary, one set of progress lines.
  EXPECT_EQ(count_of(two.out, "\"losses\""), 1) << two.out;
  EXPECT_EQ(count_of(two.err, "step 4/4"), 1) << two.err;
  EXPECT_EQ(count_of(two.err, "train: mode: full fine-tuning"), 1) << two.err;
  EXPECT_TRUE(contains(two.err, "2 ranks over mpi")) << two.err;
  const std::string metrics = slurp(path("m.jsonl"));
  EXPECT_EQ(count_of(metrics, "\"step\""), 4);
  EXPECT_EQ(count_of(metrics, "\"alltoall_bytes\""), 4);
}

// Without --grad-accum the ranks split one process's step: --batch 2 over
// 2 ranks is --batch 1 --grad-accum 2 (bit for bit), the same rows as one
// process's --batch 2 (the same losses to rounding); the log says so. An odd
// --batch runs one micro-batch a rank. Both were refused (--grad-accum 1 is
// not a multiple of 2 ranks).
TEST_F(EpCli, DefaultFlagsSplitTheStepOverTheRanks) {
  const std::vector<std::string> base = {"train", "--preset",  "tiny", "--steps",
                                         "3",     "--seq-len", "16",   "--corpus-tokens",
                                         "4096",  "--threads", "1",    "--json"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  RunResult two = run_ranks(2, with({"--ep", "2", "--batch", "2"}));
  ASSERT_EQ(two.rc, 0) << two.err;
  EXPECT_TRUE(contains(two.err,
                       "train: --grad-accum not given: the 2 ranks split each step's 2 "
                       "rows, 1 each (as --batch 1 --grad-accum 2)"))
      << two.err;
  RunResult split = run_ranks(0, with({"--batch", "1", "--grad-accum", "2"}));
  RunResult whole = run_ranks(0, with({"--batch", "2"}));
  ASSERT_EQ(split.rc, 0) << split.err;
  ASSERT_EQ(whole.rc, 0) << whole.err;
  const nlohmann::json losses = last_json_line(two.out).at("losses");
  EXPECT_EQ(losses, last_json_line(split.out).at("losses"));
  const nlohmann::json one = last_json_line(whole.out).at("losses");
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i].get<double>(), one[i].get<double>(), 1e-5 * one[i].get<double>()) << i;
  }
  RunResult odd = run_ranks(2, with({"--ep", "2", "--batch", "3"}));
  EXPECT_EQ(odd.rc, 0) << odd.err;
  EXPECT_TRUE(contains(odd.err, "a step of 6 rows (as --grad-accum 2)")) << odd.err;
}

// A checkpoint whose accumulation the ranks do not divide says which rank
// counts resume it (the hint "pass --grad-accum 4" was then refused as a
// changed flag).
TEST_F(EpCli, AResumeOverRanksThatDoNotDivideTheAccumulationNamesTheRankCounts) {
  const fs::path out = path("o");
  ASSERT_EQ(run_ranks(0, tiny({"--out", out.string(), "--stop-after", "2"}, "3")).rc, 0);
  RunResult r = run_ranks(2, {"train", "--resume", (out / "checkpoint-2").string(), "--ep", "2"});
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err,
                       "accumulates 3 micro-batch(es) a step, which the 2 ranks started do "
                       "not divide"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "mpirun -np N with N one of 1, 3")) << r.err;
}

TEST_F(EpCli, DeviceTierOnEveryRankWithOneRoutingProfile) {
  const std::vector<std::string> tier = {"--device", "cpu", "--device-memory", "64MiB",
                                         "--placement", "device", "--device-threads", "1"};
  std::vector<std::string> args = tier;
  args.insert(args.end(), {"--ep", "2", "--json", "--profile-out", path("p.json").string()});
  RunResult two = run_ranks(2, tiny(args));
  ASSERT_EQ(two.rc, 0) << two.err;
  RunResult one = run_ranks(0, tiny({"--json"}));
  ASSERT_EQ(one.rc, 0) << one.err;
  EXPECT_EQ(last_json_line(two.out).at("losses"), last_json_line(one.out).at("losses"));
  EXPECT_GT(last_json_line(two.out).at("device_calls").get<int64_t>(), 0);
  // One profile of all 8 experts, written once; the ranks each place theirs from it.
  const nlohmann::json profile = nlohmann::json::parse(slurp(path("p.json")));
  EXPECT_EQ(profile.at("experts"), 8);
  args = tier;
  args.insert(args.end(), {"--ep", "2", "--json", "--profile-in", path("p.json").string()});
  RunResult again = run_ranks(2, tiny(args));
  ASSERT_EQ(again.rc, 0) << again.err;
  EXPECT_EQ(last_json_line(again.out).at("losses"), last_json_line(one.out).at("losses"));
}

TEST_F(EpCli, EpMustMatchTheRanksStarted) {
  RunResult r = run_ranks(0, tiny({"--ep", "2"}));
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "--ep 2 but 1 rank(s) were started")) << r.err;
  r = run_ranks(2, tiny());
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "pass --ep 2")) << r.err;
  r = run_ranks(2, tiny({"--ep", "2"}, /*grad_accum=*/"3"));
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "not a multiple of the 2 ranks")) << r.err;
}

TEST_F(EpCli, AKilledRankEndsTheJobWithAMessage) {
  double seconds = 0;
  RunResult r = run_ranks(
      2, tiny({"--ep", "2", "--inject-fault", "kill:1:2", "--comm-timeout", "20"}), &seconds);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(seconds, 60);
  EXPECT_TRUE(contains(r.err, "injected fault 'kill'")) << r.err;
  // mpirun names the dead rank; the survivor says why it stops.
  EXPECT_TRUE(contains(r.err, "rank 1") && contains(r.err, "signal 9")) << r.err;
}

TEST_F(EpCli, AHungRankTimesOutTheOthers) {
  double seconds = 0;
  RunResult r = run_ranks(
      2, tiny({"--ep", "2", "--inject-fault", "hang:1:2", "--comm-timeout", "5"}), &seconds);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(seconds, 60);
  EXPECT_TRUE(contains(r.err, "error: rank 0 of 2")) << r.err;
  EXPECT_TRUE(contains(r.err, "did not complete within 5 s")) << r.err;
}

TEST_F(EpCli, AnErrorOnOneRankStopsEveryRank) {
  double seconds = 0;
  RunResult r = run_ranks(2, tiny({"--ep", "2", "--inject-fault", "error:1:3"}), &seconds);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(seconds, 60);
  EXPECT_TRUE(contains(r.err, "error: rank 1 of 2: injected error")) << r.err;
}

// Every rank refuses data with nothing to learn alike; the job prints the
// error once, whole (no rank's message cut into another's).
TEST_F(EpCli, AnErrorEveryRankMeetsIsPrintedOnce) {
  std::ofstream(path("masked.jsonl")) << R"({"input_ids": [5, 6, 7], "labels": [-100, -100, -100]})"
                                      << "\n";
  RunResult r = run_ranks(2, tiny({"--ep", "2", "--data", path("masked.jsonl").string()}));
  EXPECT_NE(r.rc, 0);
  EXPECT_EQ(count_of(r.err, "error: "), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "error: rank 0 of 2: nothing to train on")) << r.err;
}

// A SIGINT on one rank stops every rank after the same step, which all
// save together, as one process stops.
TEST_F(EpCli, ASignalOnOneRankStopsEveryRankAtTheSameStep) {
  const fs::path out = path("o");
  RunResult r =
      run_ranks(2, tiny({"--ep", "2", "--out", out.string(), "--inject-fault", "sigint:1:2"}));
  EXPECT_EQ(r.rc, 128 + SIGINT) << r.err;
  EXPECT_TRUE(contains(r.err, "stopped by SIGINT after step 2 of 4; checkpoint saved to " +
                                  (out / "checkpoint-2").string()))
      << r.err;
  EXPECT_TRUE(fs::exists(out / "checkpoint-2" / "trainer_state.json")) << r.err;
  EXPECT_FALSE(fs::exists(out / "checkpoint-4")) << r.err;
}

// A rank's missing optimizer shard is named on resume (it was reported as
// state "saved by a different optimizer").
TEST_F(EpCli, AMissingOptimizerShardIsNamedOnResume) {
  const fs::path out = path("o");
  ASSERT_EQ(run_ranks(2, tiny({"--ep", "2", "--out", out.string(), "--stop-after", "2"})).rc, 0);
  fs::remove(out / "checkpoint-2" / "optimizer-00002-of-00002.safetensors");
  RunResult r = run_ranks(2, {"train", "--resume", (out / "checkpoint-2").string(), "--ep", "2"});
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err,
                       "optimizer state shard optimizer-00002-of-00002.safetensors is "
                       "missing"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "different optimizer")) << r.err;
}

// Only rank 0 takes the --out lock; when it cannot, the whole job stops
// before any step, with rank 0's message naming the holder.
TEST_F(EpCli, ALockedOutStopsTheJobBeforeAnyStep) {
  const fs::path out = path("o");
  fs::create_directories(out);
  const int fd = ::open((out / ".tiermoe.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  double seconds = 0;
  RunResult r = run_ranks(2, tiny({"--ep", "2", "--out", out.string()}), &seconds);
  ::close(fd);
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(seconds, 60);
  EXPECT_TRUE(contains(
      r.err, "error: rank 0 of 2: another tiermoe run (pid " + std::to_string(::getpid()) + ")"))
      << r.err;
  EXPECT_FALSE(contains(r.err, "step 1/")) << r.err;
  EXPECT_FALSE(fs::exists(out / "checkpoint-4"));
}

}  // namespace
}  // namespace tiermoe
