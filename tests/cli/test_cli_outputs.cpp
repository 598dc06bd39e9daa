// What a command writes can never destroy what it reads: an output flag that
// names an input (also through a link), a model file, a checkpoint being
// resumed, or another output is refused before step 1 with the input left
// byte for byte; outputs go through a temporary file of their own, so a
// user's `.tmp` file survives and a directory target leaves nothing behind;
// an unwritable location fails before any step; --keep-last on a resume
// keeps the earlier run's later checkpoints and says what it removes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "cli/cli_fixture.h"
#include "common/test_dir.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

class CliOutputs : public Cli {
 protected:
  // A token file of the tiny preset's vocabulary, as --data.
  std::string data() const {
    std::vector<int32_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7) % 256);
    const std::string p = path("d.npy").string();
    write_npy_tokens(p, tokens, TokenDType::i32);
    return p;
  }

  // Runs args, wants it refused before step 1 with `what` in the error.
  void expect_refused(const std::vector<std::string>& args, const std::string& what) const {
    const RunResult r = run(args);
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_TRUE(contains(r.err, what)) << "want '" << what << "' in: " << r.err;
    EXPECT_FALSE(contains(r.err, "step 1/")) << r.err;
  }
};

TEST_F(CliOutputs, AnOutputNamingTheDataIsRefusedAndTheDataKept) {
  const std::string d = data();
  const std::string bytes = slurp(d);
  expect_refused(quick({"--steps", "2", "--data", d, "--metrics", d}),
                 "--metrics would overwrite " + d + ", which the run reads (--data)");
  expect_refused(
      quick({"--steps", "2", "--data", d, "--metrics", path("m.jsonl").string(), "--report", d}),
      "--report would overwrite " + d + ", which the run reads (--data)");
  expect_refused(quick({"--steps", "2", "--data", d, "--device", "cpu", "--device-memory", "8MiB",
                        "--profile-out", d}),
                 "--profile-out would overwrite");
  // Through a symbolic link and a hard link too.
  fs::create_symlink(d, path("sym.jsonl"));
  expect_refused(quick({"--steps", "2", "--data", d, "--metrics", path("sym.jsonl").string()}),
                 "--metrics would overwrite");
  fs::create_hard_link(d, path("hard.jsonl"));
  expect_refused(quick({"--steps", "2", "--data", d, "--metrics", path("hard.jsonl").string()}),
                 "--metrics would overwrite");
  EXPECT_EQ(slurp(d), bytes);
}

TEST_F(CliOutputs, AnOutputNamingAModelFileIsRefusedAndTheModelKept) {
  const fs::path model = init("m", {"--layers", "1"});
  const auto before = snapshot(model);
  expect_refused(
      {"train", "--model", model.string(), "--data", data(), "--steps", "2", "--batch", "2",
       "--seq-len", "16", "--lora-rank", "2", "--metrics", (model / "model.safetensors").string()},
      "which the run reads (--model)");
  EXPECT_EQ(snapshot(model), before);
  expect_refused({"eval", "--model", model.string(), "--data", data(), "--batch", "2", "--seq-len",
                  "16", "--save-grads", (model / "model.safetensors").string()},
                 "--save-grads would overwrite");
  EXPECT_EQ(snapshot(model), before);
}

TEST_F(CliOutputs, AnOutputInsideTheResumedCheckpointIsRefused) {
  const fs::path out = path("o");
  ASSERT_EQ(run(quick({"--steps", "2", "--save-every", "2", "--out", out.string()})).rc, 0);
  const fs::path ckpt = out / "checkpoint-2";
  const auto before = snapshot(out);
  expect_refused({"train", "--resume", ckpt.string(), "--stop-after", "3", "--metrics",
                  (ckpt / "trainer_state.json").string()},
                 "--metrics would overwrite");
  // A new file in a checkpoint would be lost when --keep-last replaces it.
  expect_refused({"train", "--resume", ckpt.string(), "--stop-after", "3", "--metrics",
                  (ckpt / "new.jsonl").string()},
                 "lies inside the checkpoint directory " + ckpt.string());
  expect_refused({"train", "--resume", ckpt.string(), "--stop-after", "3", "--metrics",
                  (out / "checkpoint-4" / "m.jsonl").string()},
                 "lies inside the checkpoint directory");
  EXPECT_EQ(snapshot(out), before);
}

TEST_F(CliOutputs, TwoOutputsNamingOneFileAreRefused) {
  const fs::path out = path("o");
  expect_refused(quick({"--steps", "2", "--save-every", "2", "--out", out.string(), "--report",
                        (out / "metrics.jsonl").string()}),
                 "name the same file");
  expect_refused(
      quick({"--steps", "2", "--metrics", path("x").string(), "--report", path("x").string()}),
      "--report and --metrics name the same file");
  fs::create_directories(path("dir"));
  expect_refused(quick({"--steps", "2", "--metrics", path("dir").string()}),
                 "--metrics names a directory");
  EXPECT_EQ(testing::dir_entries(path("dir")), std::set<std::string>{});
}

TEST_F(CliOutputs, AnUnwritableLocationFailsBeforeStepOne) {
  // Root writes through file modes, so the unwritable place is sysfs there.
  const auto can_create_in = [](const fs::path& dir) {
    const fs::path probe = dir / "tiermoe_probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return false;
    ::close(fd);
    fs::remove(probe);
    return true;
  };
  fs::path place = path("ro");
  fs::create_directories(place);
  fs::permissions(place, fs::perms::owner_read | fs::perms::owner_exec);
  if (can_create_in(place)) place = "/sys";
  if (can_create_in(place)) GTEST_SKIP() << "no unwritable directory to try";
  expect_refused(quick({"--steps", "2", "--metrics", path("m.jsonl").string(), "--report",
                        (place / "r.html").string()}),
                 "--report cannot be written");
  fs::permissions(path("ro"), fs::perms::owner_all);
}

TEST_F(CliOutputs, AUsersTmpFileIsNeverOverwritten) {
  std::ofstream(path("r.html.tmp")) << "the user's";
  std::ofstream(path("m.jsonl.tmp")) << "the user's too";
  ASSERT_EQ(run(quick({"--steps", "2", "--metrics", path("m.jsonl").string()})).rc, 0);
  const RunResult r = run({"report", path("m.jsonl").string(), "--out", path("r.html").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(slurp(path("r.html.tmp")), "the user's");
  EXPECT_EQ(slurp(path("m.jsonl.tmp")), "the user's too");
  EXPECT_TRUE(contains(slurp(path("r.html")), "<html")) << "the report itself was written";
}

TEST_F(CliOutputs, MetricsToDevNullStillRun) {
  const RunResult r = run(quick({"--steps", "2", "--metrics", "/dev/null"}));
  EXPECT_EQ(r.rc, 0) << r.err;
}

// An earlier run saved checkpoints 1-4; this one resumes from 2 with
// --keep-last 1. It replaces 3 (saying so), removes 2 once 3 is written
// (saying so), and keeps the earlier run's 4, above anything it wrote.
TEST_F(CliOutputs, KeepLastOnAResumeKeepsLaterCheckpointsAndLogsRemovals) {
  const fs::path out = path("o");
  ASSERT_EQ(run(quick({"--steps", "4", "--save-every", "1", "--out", out.string()})).rc, 0);
  const RunResult r = run({"train", "--resume", (out / "checkpoint-2").string(), "--stop-after",
                           "3", "--keep-last", "1"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "train: replacing " + (out / "checkpoint-3").string())) << r.err;
  EXPECT_TRUE(
      contains(r.err, "train: removed " + (out / "checkpoint-2").string() + " (--keep-last 1)"))
      << r.err;
  EXPECT_TRUE(contains(r.err, "train: removed " + (out / "checkpoint-1").string())) << r.err;
  EXPECT_EQ(testing::dir_entries(out),
            (std::set<std::string>{"checkpoint-3", "checkpoint-4", "final"}));
}

}  // namespace
}  // namespace tiermoe
