// What a user types is read as typed or refused, never silently misread:
// integers in base 10 and within their type (no octal, no wrapped seeds),
// numbers finite and present, flags that promise checkpoints only with
// somewhere to write them, LoRA targets that name modules of the model, and
// a long --seq-len over a --data file not checked against the built-in
// corpus. Each was a silent misreading before (issue 48's cases).
#include <gtest/gtest.h>
#include <signal.h>

#include "cli_fixture.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

class CliFlags : public Cli {
 protected:
  // A quick train run (one layer of tiny, 2 x 16 tokens), then `extra`.
  RunResult train(std::vector<std::string> extra) const {
    std::vector<std::string> args = {"train", "--layers",        "1",   "--batch",
                                     "2",     "--seq-len",       "16",  "--threads",
                                     "1",     "--corpus-tokens", "4096"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  }
  static void expect_bad_command_line(const RunResult& r, const std::string& needle) {
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_TRUE(contains(r.err, needle)) << "no '" << needle << "' in\n" << r.err;
    EXPECT_FALSE(contains(r.err, "step 1/")) << r.err;
  }
};

TEST_F(CliFlags, IntegersAreBase10AndWithinTheirType) {
  const RunResult ten = train({"--steps", "010"});  // CLI11 read 8
  ASSERT_EQ(ten.rc, 0) << ten.err;
  EXPECT_TRUE(contains(ten.err, "step 10/10")) << ten.err;
  expect_bad_command_line(train({"--steps", "0x10"}), "'0x10' is not a base-10 integer");
  expect_bad_command_line(train({"--steps", ""}), "'' is not a base-10 integer");
  // A seed is a 64-bit unsigned integer: -1 and 2^64 wrapped to 2^64 - 1.
  expect_bad_command_line(train({"--seed", "-1"}), "-1 is negative");
  expect_bad_command_line(train({"--seed", "18446744073709551616"}),
                          "outside the range of a 64-bit unsigned integer");
  EXPECT_EQ(train({"--steps", "1", "--seed", "18446744073709551615"}).rc, 0);
}

TEST_F(CliFlags, NumbersAreFiniteAndPresent) {
  expect_bad_command_line(train({"--lr", "inf"}), "--lr: inf is not a finite number");
  expect_bad_command_line(train({"--lr", "1e400"}), "1e400 is not a finite number");
  expect_bad_command_line(train({"--lr", ""}), "'' is not a number");  // was 0
  expect_bad_command_line(train({"--lora-alpha", "nan"}), "nan is not a finite number");
}

TEST_F(CliFlags, CheckpointFlagsNeedSomewhereToWrite) {
  for (const char* flag : {"--save-every", "--keep-last", "--stop-after"}) {
    expect_bad_command_line(train({"--steps", "2", flag, "1"}),
                            std::string(flag) + ": saves checkpoints, and the run has no --out");
  }
  const RunResult r = train({"--steps", "2", "--stop-after", "1", "--out", path("run").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("run") / "checkpoint-1")) << r.err;
}

// --max-memory 0 read as "no limit"; --device-memory 0 was refused. Both are
// refused now, and byte counts take TB and TiB.
TEST_F(CliFlags, ByteCountsMeanOneThing) {
  RunResult r = train({"--steps", "1", "--max-memory", "0"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_TRUE(contains(r.err, "--max-memory: is 0")) << r.err;
  r = train({"--steps", "1", "--device", "cpu", "--device-memory", "0"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_TRUE(contains(r.err, "--device-memory: is 0")) << r.err;
  EXPECT_EQ(train({"--steps", "1", "--max-memory", "1TiB"}).rc, 0);
  EXPECT_EQ(train({"--steps", "1", "--max-memory", "2TB"}).rc, 0);
  r = train({"--steps", "1", "--max-memory", "1PB"});
  EXPECT_TRUE(contains(r.err, "cannot read '1PB' as a byte count")) << r.err;
}

TEST_F(CliFlags, LoraTargetsNameModulesOfTheModel) {
  RunResult r = train({"--steps", "1", "--lora-targets", ""});  // was the default targets
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "empty name in the LoRA target list")) << r.err;
  // Latent attention has no k_proj or v_proj (nor q_proj with a q latent):
  // they adapted nothing and were still exported.
  r = train(
      {"--preset", "tiny-deepseek-v3", "--steps", "1", "--lora-targets", "q_a_proj,k_proj,o_proj"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "LoRA target 'k_proj' matches no module of this deepseek_v3 model"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "kv_a_proj_with_mqa")) << r.err;  // the hint lists the real ones
  EXPECT_EQ(train({"--preset", "tiny-deepseek-v3", "--steps", "1", "--lora-targets",
                   "q_a_proj,kv_b_proj,o_proj"})
                .rc,
            0);
}

// Two runs with their own --out and the same --metrics: the second is
// refused while the first writes (one run's lines were lost before).
TEST_F(CliFlags, ASecondRunOnTheSameMetricsFileIsRefused) {
  const fs::path log = path("log"), metrics = path("m.jsonl");
  const pid_t pid = spawn({"train", "--layers", "1", "--batch", "2", "--seq-len", "16", "--threads",
                           "1", "--corpus-tokens", "4096", "--steps", "1000000", "--progress-every",
                           "1", "--out", path("a").string(), "--metrics", metrics.string()},
                          log);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_text(log, "step 2/")) << slurp(log);
  const RunResult second =
      train({"--steps", "1", "--out", path("b").string(), "--metrics", metrics.string()});
  ::kill(pid, SIGINT);
  wait_status(pid);
  EXPECT_EQ(second.rc, 1);
  EXPECT_TRUE(contains(second.err, "another tiermoe run (pid ")) << second.err;
  EXPECT_TRUE(contains(second.err, "is writing --metrics " + metrics.string())) << second.err;
  // Once the first has ended, the file is free again.
  EXPECT_EQ(train({"--steps", "1", "--metrics", metrics.string()}).rc, 0);
}

TEST_F(CliFlags, ALongSeqLenOverADataFileIsNotCheckedAgainstTheBuiltInCorpus) {
  std::vector<int32_t> tokens(6000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 7 % 256);
  const std::string data = path("tokens.npy").string();
  write_npy_tokens(data, tokens, TokenDType::i32);
  // --corpus-tokens 4096 (train's) is shorter than the window; the file is not.
  const RunResult r =
      run({"train", "--layers", "1", "--batch", "1", "--seq-len", "5000", "--threads", "1",
           "--corpus-tokens", "4096", "--steps", "1", "--data", data});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "step 1/1")) << r.err;
}

}  // namespace
}  // namespace tiermoe
