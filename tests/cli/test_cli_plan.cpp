// tiermoe plan as a user runs it: the JSON it prints, the budget it keeps,
// profiles from a file or synthetic, and clear errors for bad profiles.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace tiermoe {
namespace {

using Json = nlohmann::json;

// Given rates, so nothing is measured and the plan is deterministic.
const std::vector<std::string> kRates = {"--host-tflops", "0.1", "--device-tflops", "1",
                                         "--link-gbps",   "10",  "--launch-us",     "5"};

std::vector<std::string> plan_args(std::vector<std::string> extra, bool rates = true) {
  std::vector<std::string> args = {"plan", "--preset", "tiny", "--synthetic-zipf",
                                   "1.0",  "--tokens", "256"};
  args.insert(args.end(), extra.begin(), extra.end());
  if (rates) args.insert(args.end(), kRates.begin(), kRates.end());
  return args;
}

TEST_F(Cli, PlanJsonKeepsTheBudget) {
  // tiny: 2 MoE layers x 8 experts; a bf16 expert is 12 KB, the workspace
  // (two sets) about 600 KB, so 700KB holds a few experts and not all 16.
  for (const char* placement : {"auto", "device"}) {
    RunResult r = run(plan_args({"--device-memory", "700KB", "--placement", placement, "--json"}));
    ASSERT_EQ(r.rc, 0) << r.err;
    const Json j = last_json_line(r.out);
    for (const char* key :
         {"resident", "hot_fraction", "step_s", "all_host_step_s", "speedup", "bytes",
          "budget_bytes", "workspace_bytes", "expert_bytes", "layers", "rates", "profile"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    const size_t budget = j["budget_bytes"], bytes = j["bytes"];
    const size_t ws = j["workspace_bytes"], per = j["expert_bytes"];
    const int64_t resident = j["resident"];
    EXPECT_EQ(budget, 700000u);
    EXPECT_LE(bytes, budget);
    EXPECT_EQ(bytes, resident > 0 ? ws + size_t(resident) * per : 0);
    EXPECT_LT(resident, 16);
    if (std::string(placement) == "device") {
      EXPECT_GT(bytes + per, budget) << "device placement leaves room for another expert";
    }
    ASSERT_EQ(j["layers"].size(), 2u);
    int64_t sum = 0;
    for (const Json& l : j["layers"]) {
      for (const char* key : {"resident", "resident_experts", "hot_fraction", "host_s", "device_s",
                              "transfer_s", "makespan_s"}) {
        EXPECT_TRUE(l.contains(key)) << key;
      }
      EXPECT_EQ(l["resident"], l["resident_experts"].size());
      sum += l["resident"].get<int64_t>();
    }
    EXPECT_EQ(sum, resident);
    EXPECT_FALSE(j["rates"]["measured"]["host"].get<bool>());
    EXPECT_EQ(j["rates"]["device_flops_per_s"], 1e12);
    EXPECT_LE(j["step_s"].get<double>(), j["all_host_step_s"].get<double>());
    // The text report goes to stderr with --json.
    EXPECT_TRUE(contains(r.err, "makespan ms")) << r.err;
  }
}

TEST_F(Cli, PlanHostPlacementAndTextReport) {
  RunResult r = run(plan_args({"--device-memory", "1MB", "--placement", "host"}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "total: 0 resident experts")) << r.out;
  EXPECT_TRUE(contains(r.out, "layer  resident")) << r.out;
  EXPECT_TRUE(contains(r.out, "(given)")) << r.out;
}

TEST_F(Cli, PlanMeasuresWhenNoRatesAreGiven) {
  RunResult r = run(plan_args({"--device-memory", "1MB", "--mode", "full", "--json"}, false));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "measuring a CPU device")) << r.err;
  const Json j = last_json_line(r.out);
  for (const char* key : {"host", "device", "link", "launch"}) {
    EXPECT_TRUE(j["rates"]["measured"][key].get<bool>()) << key;
  }
  EXPECT_GT(j["rates"]["host_flops_per_s"].get<double>(), 0);
  EXPECT_GT(j["rates"]["device_flops_per_s"].get<double>(), 0);
  EXPECT_EQ(j["mode"], "full");
}

TEST_F(Cli, PlanReadsAProfileFileAndACheckpointConfig) {
  const std::string saved = path("profile.json").string();
  RunResult a = run(plan_args({"--device-memory", "400KB", "--save-profile", saved, "--json"}));
  ASSERT_EQ(a.rc, 0) << a.err;
  const fs::path model = init("model");
  RunResult b = run({"plan", "--model", model.string(), "--profile", saved, "--device-memory",
                     "400KB", "--json", "--host-tflops", "0.1", "--device-tflops", "1",
                     "--link-gbps", "10", "--launch-us", "5"});
  ASSERT_EQ(b.rc, 0) << b.err;
  const Json ja = last_json_line(a.out), jb = last_json_line(b.out);
  EXPECT_EQ(jb["profile"]["source"], saved);
  EXPECT_EQ(ja["layers"], jb["layers"]);  // same profile, same model shape: same plan
}

TEST_F(Cli, PlanRejectsBadProfiles) {
  const std::string bad = path("bad.json").string();
  std::ofstream(bad) << R"({"format": "tiermoe-routing-profile", "version": 1, "decay": 0.9,
      "steps": 1, "layers": 2, "experts": 8, "rows": [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2]]})";
  RunResult r = run({"plan", "--preset", "tiny", "--profile", bad, "--device-memory", "1MB"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "must list 8 experts")) << r.err;
  EXPECT_TRUE(contains(r.err, bad)) << r.err;
  EXPECT_TRUE(contains(r.err, "hint:")) << r.err;

  // A well-formed profile of another model: 3 layers for tiny's 2.
  const std::string other = path("other.json").string();
  ASSERT_EQ(run(plan_args({"--layers", "3", "--device-memory", "1MB", "--save-profile", other})).rc,
            0);
  r = run({"plan", "--preset", "tiny", "--profile", other, "--device-memory", "1MB"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "the profile has 3 layers x 8 experts")) << r.err;
  EXPECT_TRUE(contains(r.err, other)) << r.err;
  EXPECT_TRUE(contains(r.err, "--layers")) << r.err;

  r = run({"plan", "--preset", "tiny", "--profile", path("missing.json").string(),
           "--device-memory", "1MB"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "missing.json")) << r.err;

  r = run({"plan", "--preset", "tiny", "--device-memory", "1MB"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "--synthetic-zipf")) << r.err;
}

TEST_F(Cli, PlanRejectsBadFlags) {
  RunResult r = run(plan_args({"--device-memory", "lots"}));
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "byte count")) << r.err;
  r = run(plan_args({"--device-memory", "1MB", "--placement", "gpu"}));
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "unknown placement")) << r.err;
  r = run(plan_args({"--device-memory", "1MB", "--mode", "train"}));
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "unknown training mode")) << r.err;
  r = run({"plan", "--preset", "tiny", "--synthetic-zipf", "1", "--device-memory", "1MB"});
  EXPECT_EQ(r.rc, 2);  // --synthetic-zipf needs --tokens: a parse error
}

}  // namespace
}  // namespace tiermoe
