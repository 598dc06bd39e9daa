// tiermoe report and train --report as a user runs them: the page a tiered
// run leaves, the live page a checkpoint leaves when the run then fails, a
// plan's page, and clear errors for what cannot be reported.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace tiermoe {
namespace {

// Room for the CPU device's workspace and some of the tiny preset's experts
// (full fine-tuning, f32), placed at once.
const std::vector<std::string> kTier = {"--device", "cpu",         "--device-memory",
                                        "1500KB",   "--placement", "device"};

std::vector<std::string> train_args(const fs::path& out, std::vector<std::string> extra) {
  std::vector<std::string> args = {"train",   "--preset", "tiny",      "--steps", "6",
                                   "--batch", "2",        "--seq-len", "16",      "--corpus-tokens",
                                   "4096",    "--out",    out.string()};
  args.insert(args.end(), kTier.begin(), kTier.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST_F(Cli, TrainReportDrawsTheRunAndReportRedrawsIt) {
  const fs::path run_dir = path("run"), page = path("run.html");
  RunResult r = run(train_args(run_dir, {"--save-every", "3", "--report", page.string()}));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "train: report written to " + page.string())) << r.err;
  const std::string html = slurp(page);
  for (const char* chart :
       {"loss", "lr", "throughput", "time", "device", "tier", "load-run", "memory"}) {
    EXPECT_EQ(count_of(html, std::string("data-chart=\"") + chart + "\""), 1) << chart;
  }
  EXPECT_FALSE(contains(html, "http-equiv=\"refresh\""));  // the run is over
  EXPECT_TRUE(contains(html, "6 of 6"));
  EXPECT_TRUE(contains(html, "entropy floor"));
  // Without --metrics the metrics went into the run directory.
  std::istringstream lines(slurp(run_dir / "metrics.jsonl"));
  int n = 0;
  for (std::string l; std::getline(lines, l);) ++n;
  EXPECT_EQ(n, 6);

  // tiermoe report on the directory draws the same charts.
  r = run({"report", run_dir.string(), "--out", path("again.html").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "report: 8 charts written to")) << r.err;
  EXPECT_EQ(count_of(slurp(path("again.html")), "data-chart="), 8);
}

TEST_F(Cli, ACheckpointLeavesALivePageThatARunFailingLaterKeeps) {
  const fs::path page = path("live.html");
  RunResult r = run(train_args(path("run"), {"--save-every", "3", "--report", page.string(),
                                             "--inject-fault", "error:0:5"}));
  ASSERT_EQ(r.rc, 1) << r.err;
  const std::string html = slurp(page);
  EXPECT_TRUE(contains(html, "http-equiv=\"refresh\""));
  EXPECT_TRUE(contains(html, "written at step 3 of 6")) << html.substr(0, 3000);
  EXPECT_TRUE(contains(html, "data-chart=\"load-run\""));  // checkpoint-3's profile
}

TEST_F(Cli, APlanAloneIsReportedWithItsPlacement) {
  RunResult r = run({"plan", "--preset", "tiny", "--synthetic-zipf", "1.0", "--tokens", "256",
                     "--device-memory", "700KB", "--host-tflops", "0.1", "--device-tflops", "1",
                     "--link-gbps", "10", "--launch-us", "5", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json plan = last_json_line(r.out);
  ASSERT_EQ(plan.at("layers").at(0).at("rows").size(), 8u);  // the profile's rows, per expert
  std::ofstream(path("plan.json")) << r.out;
  r = run({"report", "--plan", path("plan.json").string(), "--out", path("plan.html").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string html = slurp(path("plan.html"));
  EXPECT_TRUE(contains(html, "data-chart=\"load-plan\""));
  int64_t resident = 0;
  for (const auto& l : plan.at("layers")) resident += l.at("resident").get<int64_t>();
  EXPECT_GT(resident, 0);
  EXPECT_EQ(count_of(html, "class=\"res\""), resident);  // one outline per resident expert
}

// A profile or plan of another model than the run's is refused, naming it
// (the report drew the mismatched heatmap where plan and train refuse it),
// and so is a plan whose shape differs from the profile's.
TEST_F(Cli, AProfileOrPlanOfAnotherModelIsRefused) {
  const fs::path run_dir = path("run");
  ASSERT_EQ(run(train_args(run_dir, {"--save-every", "3", "--metrics",
                                     (run_dir / "metrics.jsonl").string()}))
                .rc,
            0);
  const std::string other = path("other.json").string(), plan = path("plan.json").string();
  RunResult r = plan_synthetic("qwen3-30b-a3b", "4", {"--save-profile", other, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::ofstream(plan) << r.out;
  for (const auto& [flag, file] : {std::pair{"--profile", other}, std::pair{"--plan", plan}}) {
    r = run({"report", run_dir.string(), flag, file, "--out", path("x.html").string()});
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_TRUE(contains(r.err, "its load is 4 MoE layers x 128 experts; the run's model"))
        << r.err;
    EXPECT_TRUE(contains(r.err, "[" + file + "]")) << r.err;
    EXPECT_FALSE(fs::exists(path("x.html")));
  }
  // The run's own profile beside a plan of its own shape is drawn.
  r = run({"plan", "--preset", "tiny", "--synthetic-zipf", "1", "--tokens", "64", "--device-memory",
           "700KB", "--host-tflops", "0.1", "--device-tflops", "1", "--link-gbps", "10",
           "--launch-us", "5", "--json"});
  std::ofstream(plan) << r.out;
  r = run({"report", run_dir.string(), "--plan", plan, "--out", path("x.html").string()});
  EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(Cli, WhatCannotBeReportedIsAClearError) {
  RunResult r = run({"report", path("nowhere").string(), "--out", path("x.html").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "error: ")) << r.err;
  EXPECT_TRUE(contains(r.err, path("nowhere").string())) << r.err;

  fs::create_directories(path("empty"));
  r = run({"report", path("empty").string(), "--out", path("x.html").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "no metrics.jsonl")) << r.err;

  std::ofstream(path("bad.jsonl")) << "{\"step\": 1, \"loss\": 2, \"step_time_s\": 0.1}\nnope\n";
  r = run({"report", path("bad.jsonl").string(), "--out", path("x.html").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, path("bad.jsonl").string() + ":2")) << r.err;

  r = run({"report", path("bad.jsonl").string(), "--out", path("no/such/dir/x.html").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "does not exist")) << r.err;

  r = run({"report", "--out", path("x.html").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "nothing to report")) << r.err;
  r = run({"report", path("bad.jsonl").string()});
  EXPECT_EQ(r.rc, 2);  // --out is required
  EXPECT_FALSE(fs::exists(path("x.html")));

  // train --report needs somewhere for the metrics.
  r = run({"train", "--preset", "tiny", "--steps", "2", "--report", path("r.html").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.err, "--report")) << r.err;
}

}  // namespace
}  // namespace tiermoe
