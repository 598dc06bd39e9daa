// tiermoe train stopped and resumed: the first SIGINT, SIGTERM or SIGHUP
// finishes the step in progress, saves a checkpoint, says where it went and
// exits 128 + the signal (the resumed run ends where an uninterrupted one
// does); without --out it says nothing was saved; a second signal ends the
// process at once. A run started with relative paths resumes from another
// working directory, and with the same files named by absolute paths.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <set>
#include <thread>

#include "cli/cli_fixture.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

class CliSignals : public Cli {
 protected:
  struct Stopped {
    int status = 0;
    std::string err;
  };
  // A long run writing checkpoints to `out`, sent `signals` back to back
  // once its second step has begun; how it ended and its log.
  Stopped stop_a_run(const fs::path& out, const fs::path& log, std::initializer_list<int> signals) {
    const pid_t pid =
        spawn(quick({"--steps", "1000000", "--progress-every", "1", "--out", out.string()}), log);
    EXPECT_GT(pid, 0);
    if (pid <= 0) return {};
    EXPECT_TRUE(wait_for_text(log, "step 2/")) << slurp(log);
    for (int sig : signals) ::kill(pid, sig);
    const int status = wait_status(pid);
    return {status, slurp(log)};
  }
};

TEST_F(CliSignals, TheFirstSignalSavesACheckpointAndTheResumeEndsAsAnUnbrokenRun) {
  const fs::path out = path("o");
  const RunResult stopped =
      run(quick({"--steps", "5", "--out", out.string(), "--inject-fault", "sigint:0:2"}));
  EXPECT_EQ(stopped.rc, 128 + SIGINT) << stopped.err;
  const std::string ckpt = (out / "checkpoint-2").string();
  EXPECT_TRUE(contains(stopped.err,
                       "train: SIGINT received: finishing the step in progress, then "
                       "saving a checkpoint"))
      << stopped.err;
  EXPECT_TRUE(contains(stopped.err,
                       "train: stopped by SIGINT after step 2 of 5; checkpoint saved "
                       "to " +
                           ckpt))
      << stopped.err;
  EXPECT_TRUE(contains(stopped.err, "tiermoe train --resume " + ckpt)) << stopped.err;
  EXPECT_EQ(testing::dir_entries(out), std::set<std::string>{"checkpoint-2"});

  const RunResult resumed = run({"train", "--resume", ckpt, "--json"});
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  const RunResult whole = run(quick({"--steps", "5", "--json"}));
  ASSERT_EQ(whole.rc, 0) << whole.err;
  EXPECT_EQ(last_json_line(resumed.out).at("final_loss"),
            last_json_line(whole.out).at("final_loss"));
}

TEST_F(CliSignals, WithoutOutItSaysNothingWasSaved) {
  const RunResult r = run(quick({"--steps", "5", "--inject-fault", "sigint:0:3"}));
  EXPECT_EQ(r.rc, 128 + SIGINT) << r.err;
  EXPECT_TRUE(
      contains(r.err, "stopped by SIGINT after step 3 of 5; nothing saved (no --out given)"))
      << r.err;
}

// SIGTERM and SIGHUP from outside, as a scheduler or a closed terminal sends.
TEST_F(CliSignals, SigtermAndSighupFromOutsideSaveTheRun) {
  for (const int sig : {SIGTERM, SIGHUP}) {
    fs::path out = path("o"), log = path("log");
    out += std::to_string(sig);
    log += std::to_string(sig);
    const auto [status, err] = stop_a_run(out, log, {sig});
    ASSERT_TRUE(WIFEXITED(status)) << "ended by a signal: " << err;
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << err;
    EXPECT_TRUE(contains(err, "checkpoint saved to " + out.string() + "/checkpoint-")) << err;
    ASSERT_EQ(testing::dir_entries(out).size(), 1u) << err;
    EXPECT_TRUE(fs::exists(out / *testing::dir_entries(out).begin() / "trainer_state.json"));
  }
}

// Two SIGTERMs at once, as timeout(1) delivers them (to the process and to
// its group): one request, so the run still saves its checkpoint.
TEST_F(CliSignals, TwoSignalsAtOnceAreOneRequest) {
  const fs::path out = path("o"), log = path("log");
  const auto [status, err] = stop_a_run(out, log, {SIGTERM, SIGTERM});
  ASSERT_TRUE(WIFEXITED(status)) << "ended by the second signal: " << err;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << err;
  EXPECT_TRUE(contains(err, "checkpoint saved to " + out.string() + "/checkpoint-")) << err;
}

// A stop does not wait out a long step: between micro-batches the step is
// abandoned whole (no update), and the run ends as a stop does. The step
// here is 200,000 micro-batches (20 s or more on 2 cores); the stop waits
// for one.
TEST_F(CliSignals, AStopAbandonsALongGradAccumStep) {
  const fs::path out = path("o"), log = path("log");
  const pid_t pid =
      spawn(quick({"--steps", "2", "--grad-accum", "200000", "--out", out.string()}), log);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_text(log, "train: ")) << slurp(log);  // loaded; step 1 under way
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto sent = std::chrono::steady_clock::now();
  ::kill(pid, SIGINT);
  const int status = wait_status(pid);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  ASSERT_TRUE(WIFEXITED(status)) << slurp(log);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT) << slurp(log);
  EXPECT_LT(waited, 5.0) << slurp(log);
  EXPECT_FALSE(contains(slurp(log), "step 1/")) << slurp(log);  // abandoned, not finished
}

// A run that hangs inside a step (the test's fault) keeps waiting after the
// first SIGINT; the second ends it as SIGINT does, with nothing saved.
TEST_F(CliSignals, TheSecondSignalEndsTheRunAtOnce) {
  const fs::path out = path("o"), log = path("log");
  const pid_t pid =
      spawn(quick({"--steps", "5", "--out", out.string(), "--inject-fault", "hang:0:2"}), log);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_text(log, "injected fault 'hang'")) << slurp(log);
  ::kill(pid, SIGINT);
  ASSERT_TRUE(wait_for_text(log, "SIGINT received")) << slurp(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // past the same-request window
  ::kill(pid, SIGINT);
  const int status = wait_status(pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << slurp(log);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  EXPECT_FALSE(fs::exists(out / "checkpoint-2"));
}

TEST_F(CliSignals, ARunStartedWithRelativePathsResumesFromAnywhere) {
  init("m", {"--layers", "1"});
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 5) % 256);
  write_npy_tokens(path("d.npy").string(), tokens, TokenDType::i32);
  const auto run_in = [&](const fs::path& cwd, const std::vector<std::string>& args) {
    std::string cmd = "cd '" + cwd.string() + "' && '" + TIERMOE_CLI_PATH + "'";
    for (const auto& a : args) cmd += " '" + a + "'";
    cmd += " 2>'" + path("stderr").string() + "' >/dev/null";
    const int status = std::system(cmd.c_str());
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(path("stderr")));
  };
  const auto [rc, err] =
      run_in(dir_, {"train", "--model", "m", "--data", "d.npy", "--lora-rank", "2", "--batch", "2",
                    "--seq-len", "16", "--steps", "4", "--stop-after", "2", "--out", "o"});
  ASSERT_EQ(rc, 0) << err;
  const std::string ckpt = path("o/checkpoint-2").string();
  const auto [rc2, err2] = run_in("/", {"train", "--resume", ckpt, "--stop-after", "3"});
  EXPECT_EQ(rc2, 0) << err2;
  const auto [rc3, err3] =
      run_in("/", {"train", "--resume", ckpt, "--model", path("m").string() + "/", "--data",
                   path("d.npy").string()});
  EXPECT_EQ(rc3, 0) << err3;
}

}  // namespace
}  // namespace tiermoe
