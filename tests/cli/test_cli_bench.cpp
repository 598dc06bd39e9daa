// tiermoe bench moe-layer and bench peak as a user runs them: the JSON contract (docs/architecture.md),
// the remat report it prints, and clear errors for bad flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace tiermoe {
namespace {

TEST_F(Cli, BenchMoeLayerJsonHasTheContractKeys) {
  RunResult r = run({"bench", "moe-layer", "--preset", "tiny", "--tokens", "64", "--iters", "1",
                     "--warmup", "0", "--mode", "full", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = last_json_line(r.out);
  for (const char* key : {"tokens_per_s", "tflops", "retained_bytes", "mode", "dtype", "tokens",
                          "threads", "saved_tensors"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["mode"], "full");
  EXPECT_EQ(j["dtype"], "bf16");
  EXPECT_EQ(j["tokens"], 64);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
  // The report's total is the bytes the forward retained.
  EXPECT_EQ(j["saved_tensors"]["bytes"], j["retained_bytes"]);
}

TEST_F(Cli, BenchMoeLayerRematPolicyShrinksWhatIsRetained) {
  auto retained = [&](const std::string& policy) {
    RunResult r = run({"bench", "moe-layer", "--preset", "tiny", "--tokens", "64", "--iters",
                       "1", "--warmup", "0", "--remat", policy, "--json"});
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(contains(r.err, "remat policy: " + policy)) << r.err;  // the table
    return last_json_line(r.out)["retained_bytes"].get<size_t>();
  };
  size_t none = retained("none"), full = retained("full");
  EXPECT_LT(full, none);
}

TEST_F(Cli, BenchMoeLayerRejectsBadFlags) {
  RunResult r = run({"bench", "moe-layer", "--preset", "tiny", "--remat", "save:w3"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "w13")) << r.err;  // lists the valid region names
  r = run({"bench", "moe-layer", "--preset", "tiny", "--mode", "train"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "fwd, lora")) << r.err;
  r = run({"bench", "moe-layer", "--preset", "tiny", "--dtype", "f64"});
  EXPECT_EQ(r.rc, 1);
}

// bench peak: both dtypes' peaks on the process's ISA, the bf16 one at least
// the f32 one (a bf16 product runs on the f32 FMAs where nothing faster
// exists), and the memory read bandwidth; the thread count is bounded.
TEST_F(Cli, BenchPeakJsonNamesIsaThreadsAndBothPeaks) {
  RunResult r = run({"bench", "peak", "--threads", "1", "--seconds", "0.05", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = last_json_line(r.out);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_FALSE(j["isa"].get<std::string>().empty());
  EXPECT_GT(j["f32_flops"].get<double>(), 1e8);
  EXPECT_GE(j["bf16_flops"].get<double>(), 0.5 * j["f32_flops"].get<double>());
  // A stream read on one core: above 100 MB/s, below any memory system's 1 TB/s.
  EXPECT_GT(j["read_bytes_per_s"].get<double>(), 1e8);
  EXPECT_LT(j["read_bytes_per_s"].get<double>(), 1e12);
  r = run({"bench", "peak", "--threads", "100000"});
  EXPECT_EQ(r.rc, 2);  // a flag out of its range, as CLI11 reports it
  EXPECT_TRUE(contains(r.err, "--threads")) << r.err;
}

// bench expert-kernels over stored int4 weights: the four products only (the
// frozen experts have no weight gradients), their bytes the codes and
// scales; an unknown format is refused naming the flag.
TEST_F(Cli, BenchExpertKernelsOverQuantizedWeights) {
  RunResult r = run({"bench", "expert-kernels", "--preset", "tiny", "--experts", "int4", "--group",
                     "32", "--rows", "4", "--iters", "1", "--threads", "1", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = last_json_line(r.out);
  EXPECT_EQ(j["weights"], "int4 g32");
  std::vector<std::string> kernels;
  for (const auto& k : j["kernels"]) kernels.push_back(k["kernel"].get<std::string>());
  EXPECT_EQ(kernels, (std::vector<std::string>{"w13_glu", "w2", "w2_dx", "w13_dx"}));
  r = run({"bench", "expert-kernels", "--preset", "tiny", "--experts", "nf4"});
  EXPECT_NE(r.rc, 0);
  EXPECT_TRUE(contains(r.err, "--experts")) << r.err;
}

}  // namespace
}  // namespace tiermoe
