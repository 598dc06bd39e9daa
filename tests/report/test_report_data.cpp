// The report's data layer against the metrics it reads: a real tiny run with
// the device tier writes --metrics and checkpoints, and every series the
// report draws must equal the lines of that file (read here independently,
// line by line). Then the rules for resumed runs, cut and malformed files,
// plans and profiles, and which charts a page gets.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/test_dir.h"
#include "common/tier_runs.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/report/html_report.h"
#include "tiermoe/report/report_data.h"
#include "tiermoe/tier/routing_profile.h"
#include "tiermoe/train/trainer_session.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The tiny preset with a CPU device holding a few experts, rates fixed so
// the placement follows the routing (tests/common/tier_runs.h).
TrainConfig tiered_run() {
  TrainConfig c;
  c.preset = "tiny";
  c.seed = 3;
  c.corpus_tokens = 4096;
  c.trainer.steps = 8;
  c.trainer.batch = 4;
  c.trainer.seq_len = 16;
  c.trainer.schedule.warmup_steps = 2;
  c.tier = testing::moving_device_tier(c, "cpu", /*profile_in=*/"");
  return c;
}

std::vector<json> json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

class ReportData : public testing::DirTest {
 protected:
  ReportData() : DirTest("tiermoe_report_", 2) {}
};

TEST_F(ReportData, SeriesEqualTheMetricsOfARealTieredRun) {
  RunControl control;
  control.out_dir = (dir_ / "run").string();
  control.save_every = 4;
  control.metrics_file = run_dir_metrics(control.out_dir);
  fs::create_directories(control.out_dir);
  run_training(tiered_run(), control);

  const std::vector<json> lines = json_lines(control.metrics_file);
  ASSERT_EQ(lines.size(), 8u);
  const ReportSources sources = report_sources_for(control.out_dir);
  EXPECT_EQ(sources.metrics, control.metrics_file);
  EXPECT_EQ(sources.profile, (dir_ / "run" / "checkpoint-8" / "routing_profile.json").string());
  const RunSeries r = read_metrics(sources.metrics);

  ASSERT_EQ(r.step.size(), lines.size());
  EXPECT_EQ(r.total_steps, 8);
  ASSERT_TRUE(r.loss_floor.has_value());  // the built-in corpus has one
  EXPECT_EQ(*r.loss_floor, lines.back().at("loss_floor").get<double>());
  EXPECT_TRUE(r.has_tier);
  EXPECT_TRUE(r.has_time_split);
  EXPECT_TRUE(r.has_parts);
  std::vector<double> replaced, covered;
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& j = lines[i];
    const json& t = j.at("tier");
    const std::string at = "line " + std::to_string(i + 1);
    EXPECT_EQ(r.step[i], j.at("step").get<double>()) << at;
    EXPECT_EQ(r.loss[i], j.at("loss").get<double>()) << at;
    EXPECT_EQ(r.lr[i], j.at("lr").get<double>()) << at;
    EXPECT_EQ(r.grad_norm[i], j.at("grad_norm").get<double>()) << at;
    EXPECT_EQ(r.tokens_per_s[i], j.at("tokens_per_s").get<double>()) << at;
    EXPECT_EQ(r.step_time_s[i], j.at("step_time_s").get<double>()) << at;
    EXPECT_EQ(r.hot_fraction[i], t.at("hot_fraction").get<double>()) << at;
    EXPECT_EQ(r.drift[i], t.at("drift").get<double>()) << at;
    if (t.at("replacements").get<int64_t>() > 0) replaced.push_back(j.at("step").get<double>());

    // The split: the measured parts as written, the rest what they leave.
    const double step_s = j.at("step_time_s").get<double>();
    const double attention = j.at("attention_s").get<double>(), mlp = j.at("mlp_s").get<double>();
    const double host = t.at("host_s").get<double>(), wait = t.at("wait_s").get<double>();
    const double moves = t.at("move_s").get<double>() + t.at("sync_s").get<double>();
    EXPECT_GT(attention, 0.0) << at;
    EXPECT_GT(mlp, host + wait) << at;  // the experts run inside the MoE blocks
    EXPECT_LT(attention + mlp + moves, step_s) << at;
    EXPECT_EQ(r.time.attention_s[i], attention) << at;
    EXPECT_EQ(r.time.host_experts_s[i], host) << at;
    EXPECT_EQ(r.time.wait_s[i], wait) << at;
    EXPECT_EQ(r.time.tier_moves_s[i], moves) << at;
    EXPECT_DOUBLE_EQ(r.time.mlp_other_s[i], mlp - host - wait) << at;
    EXPECT_DOUBLE_EQ(r.time.other_s[i], step_s - attention - mlp - moves) << at;
    EXPECT_EQ(r.time.device_s[i], t.at("device_s").get<double>()) << at;
    EXPECT_EQ(r.time.transfer_s[i], t.at("transfer_s").get<double>()) << at;

    // The whole step's parts: what a tiered MoE step does all shows, the
    // wait is the tier's, and the disjoint parts never exceed the step. How
    // much of the step they cover is asserted over the median step below: a
    // 16 ms step on a loaded machine may lose its time to a preemption
    // anywhere, covered or not.
    const json& split = j.at("time_split_s");
    double sum = 0;
    for (size_t p = 0; p <= kNumStepParts; ++p) {
      const std::string name =
          p < kNumStepParts ? std::string(step_part_name(StepPart(p))) : "other";
      EXPECT_EQ(r.time.parts[p][i], split.at(name).get<double>()) << at << " " << name;
      if (p < kNumStepParts) sum += split.at(name).get<double>();
    }
    for (const char* part : {"data", "embedding", "norms", "projections", "attention", "router",
                             "dispatch", "experts", "lm_head", "optimizer"}) {
      EXPECT_GT(split.at(part).get<double>(), 0.0) << at << " " << part;
    }
    EXPECT_EQ(
        split.at("expert_wait").get<double>(),
        std::min(wait, split.at("experts").get<double>() + split.at("expert_wait").get<double>()))
        << at;
    EXPECT_LE(sum, step_s) << at;
    covered.push_back(sum / step_s);
    EXPECT_DOUBLE_EQ(split.at("other").get<double>(), step_s - sum) << at;

    const json& live = j.at("memory_bytes").at("live");
    ASSERT_EQ(r.memory_tags.size(), live.size()) << at;
    for (const auto& [tag, bytes] : live.items()) {
      EXPECT_EQ(r.memory_live.at(tag)[i], bytes.get<double>()) << at << " " << tag;
    }
  }
  EXPECT_EQ(r.replacement_steps, replaced);
  EXPECT_FALSE(replaced.empty());  // the placement moved in this run
  std::nth_element(covered.begin(), covered.begin() + covered.size() / 2, covered.end());
  EXPECT_GT(covered[covered.size() / 2], 0.9) << "the median step's parts cover its time";

  // The heatmap: the last checkpoint's profile, the last step's resident set.
  const json& layers = lines.back().at("tier").at("layers");
  ASSERT_EQ(r.resident_last.size(), layers.size());
  int64_t resident = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    EXPECT_EQ(r.resident_last[l], layers[l].at("resident_experts").get<std::vector<int64_t>>());
    resident += int64_t(r.resident_last[l].size());
  }
  EXPECT_EQ(resident, lines.back().at("tier").at("resident").get<int64_t>());
  EXPECT_GT(resident, 0);
  const ReportInputs in = load_report_inputs(sources);
  ASSERT_TRUE(in.run_load.has_value());
  const RoutingProfile profile = RoutingProfile::load(sources.profile);
  ASSERT_EQ(in.run_load->layers, profile.layers());
  for (int64_t l = 0; l < profile.layers(); ++l) {
    EXPECT_EQ(in.run_load->rows_LE[size_t(l)], profile.rows(l));
    for (int64_t e = 0; e < profile.experts(); ++e) {
      const auto& ids = r.resident_last[size_t(l)];
      EXPECT_EQ(in.run_load->resident_LE[size_t(l)][size_t(e)] != 0,
                std::find(ids.begin(), ids.end(), e) != ids.end());
    }
  }
  const std::vector<std::string> charts = report_chart_names(in);
  EXPECT_EQ(charts, (std::vector<std::string>{"loss", "lr", "throughput", "time", "device", "tier",
                                              "load-run", "memory"}));
  const std::string html = render_report_html(in);
  for (const std::string& c : charts) {
    EXPECT_NE(html.find("data-chart=\"" + c + "\""), std::string::npos) << c;
  }
  EXPECT_EQ(html.find("http://"), std::string::npos);  // nothing fetched
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

// Two lines of the metrics format, enough for the data layer.
std::string line(int step, double loss, double extra_tier_drift = -1) {
  json j = {{"step", step},
            {"loss", loss},
            {"lr", 0.001 * step},
            {"step_time_s", 0.5},
            {"tokens_per_s", 100.0 * step}};
  if (extra_tier_drift >= 0) {
    j["tier"] = {{"hot_fraction", 0.5}, {"drift", extra_tier_drift}, {"replacements", step % 2}};
  }
  return j.dump() + "\n";
}

TEST(ReportParse, AResumedRunThatRepeatsStepsKeepsTheLaterLines) {
  // Steps 1-4, then a resume from the checkpoint at 2 that ran 3-5 again.
  const std::string text = line(1, 9, 0.1) + line(2, 8, 0.1) + line(3, 7, 0.1) + line(4, 6, 0.1) +
                           line(3, 5, 0.2) + line(4, 4, 0.2) + line(5, 3, 0.2);
  const RunSeries r = parse_metrics(text, "m.jsonl");
  EXPECT_EQ(r.step, (std::vector<double>{1, 2, 3, 4, 5}));
  EXPECT_EQ(r.loss, (std::vector<double>{9, 8, 5, 4, 3}));
  EXPECT_EQ(r.drift, (std::vector<double>{0.1, 0.1, 0.2, 0.2, 0.2}));
  EXPECT_EQ(r.replacement_steps, (std::vector<double>{1, 3, 5}));  // odd steps re-placed
  EXPECT_EQ(r.lr.size(), 5u);
  EXPECT_EQ(r.time.other_s.size(), 5u);
}

TEST(ReportParse, OldMetricsWithoutTheNewFieldsStillRead) {
  const RunSeries r = parse_metrics(line(1, 3) + line(2, 2), "old.jsonl");
  EXPECT_FALSE(r.has_time_split);
  EXPECT_FALSE(r.has_tier);
  EXPECT_FALSE(r.loss_floor.has_value());
  EXPECT_EQ(r.total_steps, 0);
  ReportInputs in;
  in.run = r;
  // No tier, no profile, no memory: those charts are left out, not drawn empty.
  EXPECT_EQ(report_chart_names(in), (std::vector<std::string>{"loss", "lr", "throughput", "time"}));
}

TEST(ReportParse, ACutLastLineIsDroppedAndAMalformedLineNamesItsLine) {
  const std::string two = line(1, 3) + line(2, 2);
  EXPECT_EQ(parse_metrics(two + "{\"step\": 3, \"lo", "m.jsonl").step.size(), 2u);
  try {
    parse_metrics(line(1, 3) + "not json\n" + line(3, 2), "m.jsonl");
    FAIL() << "a malformed line must be an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "m.jsonl:2");
  }
  try {
    parse_metrics(line(1, 3) + "{\"step\": 2}\n", "m.jsonl");
    FAIL() << "a line without a loss must be an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "m.jsonl:2");
    EXPECT_NE(std::string(e.what()).find("loss"), std::string::npos);
  }
  EXPECT_THROW(parse_metrics("\n\n", "empty.jsonl"), Error);
  EXPECT_THROW(read_metrics("/nonexistent/metrics.jsonl"), Error);
}

TEST(ReportParse, PlanJsonGivesItsPlacementAndRows) {
  const json plan = {
      {"experts", 4},
      {"hot_fraction", 0.7},
      {"step_s", 1.5},
      {"all_host_step_s", 3.0},
      {"bytes", 1024},
      {"budget_bytes", 2048},
      {"layers",
       {{{"layer", 0}, {"resident_experts", {0, 2}}, {"rows", {5, 1, 4, 0}}},
        {{"layer", 1}, {"resident_experts", json::array()}, {"rows", {1, 1, 1, 1}}}}}};
  const PlanSeries p = parse_plan("plan: log line\n" + plan.dump() + "\n", "plan.json");
  EXPECT_EQ(p.hot_fraction, 0.7);
  EXPECT_EQ(p.bytes, 1024);
  ASSERT_TRUE(p.load.has_value());
  EXPECT_EQ(p.load->rows_LE, (std::vector<std::vector<double>>{{5, 1, 4, 0}, {1, 1, 1, 1}}));
  EXPECT_EQ(p.load->resident_LE, (std::vector<std::vector<uint8_t>>{{1, 0, 1, 0}, {0, 0, 0, 0}}));
  json bad = plan;
  bad["layers"][0]["resident_experts"] = {7};
  EXPECT_THROW(parse_plan(bad.dump(), "plan.json"), Error);
  EXPECT_THROW(parse_plan("{}", "plan.json"), Error);
  // Counts past int64 (undefined to convert; the fuzzer's finding) or past
  // the bounds are errors, not allocations.
  for (const double experts : {2.2e30, 1e12, 2.5, -1.0}) {
    json huge = plan;
    huge["experts"] = experts;
    EXPECT_THROW(parse_plan(huge.dump(), "plan.json"), Error) << experts;
  }
}

TEST(ReportParse, ATotalStepsPastAnyCountIsAnError) {
  json j = json::parse(line(1, 3));
  j["total_steps"] = 2.2e30;
  EXPECT_THROW(parse_metrics(j.dump() + "\n", "m.jsonl"), Error);
  j["total_steps"] = 6;
  EXPECT_EQ(parse_metrics(j.dump() + "\n", "m.jsonl").total_steps, 6);
}

TEST(ReportParse, AResidentExpertOutsideTheProfileIsAnError) {
  const fs::path p = fs::temp_directory_path() / "tiermoe_report_profile.json";
  RoutingProfile::synthetic(2, 4, 64, 1.0, 1).save(p.string());
  const LoadMap m = load_map_from_profile(p.string(), {{3}, {}});
  EXPECT_EQ(m.resident_LE[0], (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_THROW(load_map_from_profile(p.string(), {{4}}), Error);
  EXPECT_THROW(load_map_from_profile(p.string(), {{}, {}, {}}), Error);
  fs::remove(p);
}

}  // namespace
}  // namespace tiermoe
