// Out-of-range flags, configs that claim absurd sizes, files that are not
// files: each ends at once with exit 1 (an error) or 2 (a bad command line)
// and one `error:` line naming the flag or file, with a hint. Every command
// runs under a time limit, so one that hangs or allocates for minutes fails
// the test instead of stalling the suite.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli_fixture.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

class CliBounds : public Cli {
 protected:
  // `tiermoe <args>`, killed after 60 s (rc 137).
  RunResult run_timed(const std::vector<std::string>& args) const {
    std::string cmd = std::string("timeout -s KILL 60 '") + TIERMOE_CLI_PATH + "'";
    for (const auto& a : args) cmd += " '" + a + "'";
    cmd += " </dev/null >'" + path("stdout").string() + "' 2>'" + path("stderr").string() + "'";
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(path("stdout"));
    r.err = slurp(path("stderr"));
    return r;
  }

  // Runs and expects exit `rc` with an `error:` line holding every needle
  // and a hint, and nothing trained.
  void expect_refused(const std::vector<std::string>& args, int rc,
                      const std::vector<std::string>& needles) const {
    std::string shown;
    for (const auto& a : args) shown += a + " ";
    const RunResult r = run_timed(args);
    EXPECT_EQ(r.rc, rc) << shown << "\n" << r.err;
    EXPECT_TRUE(std::regex_search(r.err, std::regex("(^|\n)error: "))) << shown << "\n" << r.err;
    EXPECT_TRUE(contains(r.err, "hint:")) << shown << "\n" << r.err;
    for (const auto& n : needles)
      EXPECT_TRUE(contains(r.err, n)) << shown << "\nno '" << n << "' in\n" << r.err;
    EXPECT_FALSE(contains(r.err, "step 1/")) << shown << "\n" << r.err;
    EXPECT_FALSE(contains(r.err, "bad_alloc")) << shown << "\n" << r.err;
  }

  // A tiny checkpoint whose config.json has `field` set to `value` (raw JSON).
  fs::path with_config_field(const std::string& name, const std::string& field,
                             const std::string& value) const {
    const fs::path dir = init(name);
    nlohmann::json j = nlohmann::json::parse(slurp(dir / "config.json"));
    j[field] = 0;
    std::string text = j.dump(2);
    const std::string key = "\"" + field + "\": 0";
    text.replace(text.find(key), key.size(), "\"" + field + "\": " + value);
    std::ofstream(dir / "config.json") << text;
    return dir;
  }
};

// A train command that would be quick if it ran (CLI11 takes each flag once:
// the extra flags must be others).
std::vector<std::string> quick_train(std::vector<std::string> extra) {
  std::vector<std::string> args = {"train", "--layers", "1", "--batch",         "2",   "--seq-len",
                                   "16",    "--steps",  "1", "--corpus-tokens", "4096"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST_F(CliBounds, ThreadsOutsideOneToFourTimesTheCoresAreABadCommandLine) {
  for (const char* n : {"100000", "40000", "0", "-4"}) {
    expect_refused(quick_train({"--threads", n}), 2, {"--threads", n, "cores"});
  }
  expect_refused({"bench", "moe-layer", "--preset", "tiny", "--threads", "100000"}, 2,
                 {"--threads"});
  expect_refused(
      quick_train({"--device", "cpu", "--device-memory", "1MB", "--device-threads", "100000"}), 2,
      {"--device-threads"});
  for (const char* n : {"100000", "-3"}) {
    expect_refused({"bench", "expert-kernels", "--threads", n}, 2, {"--threads", n, "cores"});
  }
}

// OMP_NUM_THREADS sets the default count: past the bound it is held to the
// cores, with a warning (100000 used to crash libgomp).
TEST_F(CliBounds, OmpNumThreadsPastTheBoundIsHeldToTheCores) {
  ::setenv("OMP_NUM_THREADS", "100000", 1);
  const RunResult r = run_timed(quick_train({}));
  ::unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "warning: OMP_NUM_THREADS=100000 is above 4 x the")) << r.err;
}

TEST_F(CliBounds, ConfigsClaimingAbsurdLayerCountsAreRefusedAtOnce) {
  for (const char* layers : {"9000000000000000000", "1000000"}) {
    const fs::path dir = with_config_field(std::string("l") + layers, "num_hidden_layers", layers);
    expect_refused({"plan", "--model", dir.string(), "--synthetic-zipf", "1", "--tokens", "64",
                    "--device-memory", "1MB", "--host-tflops", "1", "--device-tflops", "1",
                    "--link-gbps", "1", "--launch-us", "1"},
                   1, {"num_hidden_layers", layers, "config.json"});
    expect_refused({"inspect", dir.string()}, 1, {"num_hidden_layers", layers});
  }
  expect_refused(
      {"init", "--preset", "tiny", "--out", path("o").string(), "--layers", "1000000000000"}, 2,
      {"--layers", "16384"});
  expect_refused({"train", "--layers", "100000", "--steps", "1"}, 2, {"--layers"});
}

TEST_F(CliBounds, RunsThatCannotFitInHostMemoryAreRefusedWithTheSizes) {
  // 2000 layers of Qwen3-30B-A3B: over a trillion parameters, 5 TB of f32
  // weights alone and 20 TB for full fine-tuning.
  expect_refused(
      {"train", "--preset", "qwen3-30b-a3b", "--layers", "2000", "--full", "--steps", "1"}, 1,
      {"needs at least", "GB of host memory", "are available", "optimizer state",
       "--preset qwen3-30b-a3b --layers 2000", "--lora-rank"});
  expect_refused({"train", "--preset", "qwen3-30b-a3b", "--layers", "2000", "--lora-rank", "8",
                  "--steps", "1"},
                 1, {"needs at least", "weights"});
  // A micro-batch of 10^9 x 64 tokens: terabytes of activations.
  expect_refused(
      {"train", "--layers", "1", "--batch", "1000000000", "--seq-len", "64", "--steps", "1"}, 1,
      {"needs at least", "activations", "--batch"});

  // eval checks before it reads the data.
  const fs::path model = init("model");
  expect_refused({"eval", "--model", model.string(), "--data", path("none.npy").string(),
                  "--seq-len", "64", "--batch", "1000000000"},
                 1, {"needs at least", "activations", "--batch x --seq-len"});
}

TEST_F(CliBounds, MeasurementsAndBenchmarksThatCannotFitAreRefused) {
  // Experts of 2^20 x 2^20: plan's start-up measurement would allocate 13 TB.
  fs::path dir = with_config_field("wide", "hidden_size", "1048576");
  nlohmann::json j = nlohmann::json::parse(slurp(dir / "config.json"));
  j["moe_intermediate_size"] = 1048576;
  std::ofstream(dir / "config.json") << j.dump(2);
  expect_refused({"plan", "--model", dir.string(), "--synthetic-zipf", "1", "--tokens", "64",
                  "--device-memory", "1MB"},
                 1, {"measuring the expert rates needs at least", "--host-tflops"});
  // 2^31 tokens through one Qwen3-30B-A3B layer: hundreds of TB of rows.
  expect_refused({"bench", "moe-layer", "--tokens", "2147483648"}, 1,
                 {"one MoE layer of qwen3-30b-a3b", "needs at least", "--tokens"});
}

TEST_F(CliBounds, NonRegularFilesAreRefusedNotOpened) {
  const std::string pipe = path("pipe").string();
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  expect_refused(quick_train({"--data", pipe}), 1, {"FIFO", pipe});
  expect_refused({"inspect", pipe}, 1, {"FIFO", pipe});

  const fs::path model = init("model");
  expect_refused(
      {"eval", "--model", model.string(), "--data", pipe, "--seq-len", "8", "--batch", "1"}, 1,
      {"FIFO", pipe});
  // A checkpoint whose weights are a FIFO.
  fs::remove(model / "model.safetensors");
  ASSERT_EQ(::mkfifo((model / "model.safetensors").c_str(), 0600), 0);
  expect_refused({"train", "--model", model.string(), "--steps", "1"}, 1,
                 {"FIFO", "model.safetensors"});
  expect_refused({"inspect", model.string()}, 1, {"FIFO", "model.safetensors"});
}

TEST_F(CliBounds, JsonNumberOverflowNamesTheFile) {
  const fs::path dir = with_config_field("theta", "rope_theta", "1e999");
  expect_refused({"inspect", dir.string()}, 1, {"1e999", (dir / "config.json").string()});

  const std::string profile = path("p.json").string();
  std::ofstream(profile) << R"({"format": "tiermoe-routing-profile", "version": 1, "decay": 1e999,
      "steps": 1, "layers": 1, "experts": 8, "rows": [[1, 2, 3, 4, 5, 6, 7, 8]]})";
  expect_refused({"plan", "--preset", "tiny", "--profile", profile, "--device-memory", "1MB"}, 1,
                 {"1e999", profile});
}

TEST_F(CliBounds, ProfilesClaimingMoreLayersThanTheyHoldAreRefusedBeforeAllocating) {
  const std::string profile = path("p.json").string();
  std::ofstream(profile) << R"({"format": "tiermoe-routing-profile", "version": 1, "decay": 0.9,
      "steps": 1, "layers": 1000000000000000, "experts": 8, "rows": [[1, 2, 3, 4, 5, 6, 7, 8]]})";
  expect_refused({"plan", "--preset", "tiny", "--profile", profile, "--device-memory", "1MB"}, 1,
                 {"\"rows\" must be an array of 1000000000000000 layers", profile});
}

// Row counts past what a step can route (1e12 allocated until bad_alloc,
// 1e19 and 1e308 ended in an internal check) are refused as the file is read.
TEST_F(CliBounds, ProfilesClaimingAbsurdRowCountsAreRefused) {
  const std::string profile = path("p.json").string();
  for (const char* rows : {"1e12", "1e19", "1e308"}) {
    std::ofstream(profile) << R"({"format": "tiermoe-routing-profile", "version": 1, "decay": 0.9,
        "steps": 1, "layers": 2, "experts": 8, "rows": [[1, 2, 3, 4, 5, 6, 7, )"
                           << rows << R"(], [1, 2, 3, 4, 5, 6, 7, 8]]})";
    expect_refused({"plan", "--preset", "tiny", "--profile", profile, "--device-memory", "1MB"}, 1,
                   {"layer 0 expert 7 has", "rows", profile});
  }
}

// Each message names the flag or file it is about, with a readable bound
// (CLI11's ranges printed DBL_MAX's 309 digits; --zipf nan surfaced as a
// router logit, --weight-decay 1e400 as a NaN embedding; a profile-in's
// mismatch named routing_profile.json; a .npy named x.jsonl got a JSON hint).
TEST_F(CliBounds, MessagesNameTheFlagOrFileWithReadableBounds) {
  const std::regex long_number("[0-9]{20}");
  const auto refused = [&](const std::vector<std::string>& args, int rc,
                           const std::vector<std::string>& needles) {
    expect_refused(args, rc, needles);
    EXPECT_FALSE(std::regex_search(slurp(path("stderr")), long_number)) << slurp(path("stderr"));
  };
  refused({"plan", "--preset", "tiny", "--synthetic-zipf", "1", "--tokens", "64", "--device-memory",
           "1MB", "--host-tflops", "1e999"},
          2, {"--host-tflops", "1e999 is not a finite number"});
  refused({"bench", "moe-layer", "--preset", "tiny", "--zipf", "nan"}, 2, {"--zipf"});
  refused(quick_train({"--weight-decay", "1e400"}), 2, {"--weight-decay"});
  refused(quick_train({"--momentum", "1.5", "--optimizer", "sgd"}), 1, {"--momentum"});

  const std::string wrong = path("wrong.json").string();
  const RunResult p = plan_synthetic("qwen3-30b-a3b", "2", {"--save-profile", wrong});
  ASSERT_EQ(p.rc, 0) << p.err;
  refused(quick_train({"--device", "cpu", "--device-memory", "8MiB", "--profile-in", wrong}), 1,
          {"128 experts per layer", "[" + wrong + "]"});

  std::vector<int32_t> tokens(100, 1);
  write_npy_tokens(path("x.jsonl").string(), tokens, TokenDType::i32);
  refused(quick_train({"--data", path("x.jsonl").string()}), 1,
          {"a NumPy .npy array, not JSON Lines", "rename it to .npy"});
}

// The data counts against --max-memory: the built-in corpus (4 bytes a
// token; 2^30 tokens under 100 MiB took 4.7 GB, sampling for a minute
// without a word) and a token file (at least its size).
TEST_F(CliBounds, TheDataCountsAgainstMaxMemory) {
  expect_refused({"train", "--layers", "1", "--batch", "2", "--seq-len", "16", "--steps", "1",
                  "--corpus-tokens", "1073741824", "--max-memory", "100MiB"},
                 1, {"the built-in corpus (1073741824 tokens)", "--max-memory", "--corpus-tokens"});
  // A token file is held as 4 bytes a token, at least its size.
  std::vector<int32_t> tokens(size_t(2) << 20, 1);
  write_npy_tokens(path("big.npy").string(), tokens, TokenDType::i32);
  expect_refused(quick_train({"--data", path("big.npy").string(), "--max-memory", "8MiB"}), 1,
                 {"the tokens of " + path("big.npy").string(), "--max-memory"});
  tokens.resize(4096);
  write_npy_tokens(path("small.npy").string(), tokens, TokenDType::i32);
  EXPECT_EQ(
      run_timed(quick_train({"--data", path("small.npy").string(), "--max-memory", "8MiB"})).rc, 0);
}

TEST_F(CliBounds, VocabularyOverflowIsNamed) {
  const fs::path dir = with_config_field("vocab", "vocab_size", "4611686018427387904");
  expect_refused({"inspect", dir.string()}, 1, {"vocab_size", "4611686018427387904"});
  const fs::path bos = with_config_field("bos", "bos_token_id", "256");
  expect_refused({"inspect", bos.string()}, 1, {"bos_token_id", "256"});
  const fs::path eos = with_config_field("eos", "eos_token_id", "[1, 300]");
  expect_refused({"eval", "--model", eos.string(), "--data", path("none.npy").string(), "--seq-len",
                  "8", "--batch", "1"},
                 1, {"eos_token_id", "300"});
}

TEST_F(CliBounds, FlagsThatWereSilentlyAcceptedAreRefused) {
  expect_refused({"init", "--preset", "tiny", "--out", path("o").string(), "--vocab-size", "0"}, 2,
                 {"--vocab-size"});
  expect_refused(quick_train({"--stop-after", "0"}), 2, {"--stop-after"});
  expect_refused(quick_train({"--max-grad-norm", "-1"}), 2, {"--max-grad-norm"});
  const fs::path model = init("model");
  expect_refused({"train", "--model", model.string(), "--preset", "small", "--steps", "1"}, 2,
                 {"--model", "--preset"});
  expect_refused(quick_train({"--device-memory", "1MB"}), 2, {"--device-memory", "--device"});
  expect_refused(quick_train({"--profile-in", path("p.json").string()}), 2,
                 {"--profile-in", "--device"});
  expect_refused(quick_train({"--device", "cpu", "--device-memory", "0"}), 2,
                 {"--device-memory: is 0"});
  expect_refused({"plan", "--preset", "tiny", "--synthetic-zipf", "1", "--tokens", "0",
                  "--device-memory", "1MB"},
                 2, {"--tokens"});
  expect_refused({"bench", "moe-layer", "--preset", "tiny", "--tokens", "1000000000000"}, 2,
                 {"--tokens"});
}

TEST_F(CliBounds, SeqLenPastMaxPositionEmbeddingsWarns) {
  // The tiny preset's max_position_embeddings is 512.
  const RunResult r = run_timed({"train", "--layers", "1", "--batch", "1", "--seq-len", "600",
                                 "--steps", "1", "--corpus-tokens", "4096"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err,
                       "warning: --seq-len 600 exceeds the model's "
                       "max_position_embeddings (512)"))
      << r.err;
  const RunResult quiet = run_timed(quick_train({}));
  EXPECT_FALSE(contains(quiet.err, "max_position_embeddings")) << quiet.err;
}

TEST_F(CliBounds, TheFineTuningModeIsExplicit) {
  const RunResult help = run_timed({"train", "--help"});
  EXPECT_EQ(help.rc, 0);
  EXPECT_FALSE(contains(help.out, "--lora-rank INT=8")) << help.out;
  EXPECT_TRUE(contains(help.out, "none means full fine-tuning")) << help.out;

  auto first_line = [](const std::string& s) { return s.substr(0, s.find('\n')); };
  const RunResult full = run_timed(quick_train({}));
  EXPECT_EQ(full.rc, 0) << full.err;
  EXPECT_EQ(first_line(full.err),
            "train: mode: full fine-tuning (the default: no --lora-* flag given): every "
            "parameter trains, fp32 masters");
  const RunResult lora = run_timed(quick_train({"--lora-rank", "4"}));
  EXPECT_EQ(lora.rc, 0) << lora.err;
  EXPECT_EQ(first_line(lora.err),
            "train: mode: LoRA (a --lora-* flag given): rank 4, alpha 4, targets "
            "k_proj,o_proj,q_proj,v_proj");
}

}  // namespace
}  // namespace tiermoe
