// SFT data with nothing to learn: a train or eval whose data holds no
// counted target (every label -100, every assistant_mask 0, one-token
// examples, or --seq-len cutting off all but the prompt) is refused naming
// the data; inside a run, a batch without a counted target is skipped and
// counted, with one warning, and never feeds the divergence check (5 good,
// 30 masked, 30 good examples trained one a step used to stop as diverged).
#include <gtest/gtest.h>

#include <fstream>

#include "cli/cli_fixture.h"
#include "tiermoe/io/sft_jsonl.h"

namespace tiermoe {
namespace {

class CliNoTargets : public Cli {
 protected:
  // An example of the tiny preset's vocabulary: n tokens, trained on from
  // token `from` on (-100 before it; from >= n: no label counted).
  static SftExample example(int n, int from, int32_t first = 1) {
    SftExample e;
    for (int i = 0; i < n; ++i) {
      e.input_ids.push_back(int32_t((first + 3 * i) % 256));
      e.labels.push_back(i >= from ? e.input_ids.back() : -100);
    }
    return e;
  }

  std::string write(const std::string& name, const std::vector<SftExample>& examples) const {
    const std::string p = path(name).string();
    write_sft_jsonl(p, examples);
    return p;
  }
};

TEST_F(CliNoTargets, DataWithNoCountedTargetIsRefusedByTrainAndEval) {
  const std::string masked = write("masked.jsonl", {example(12, 12), example(9, 9)});
  const std::string one_token = write("one.jsonl", {example(1, 0), example(1, 0)});
  // Only the answer past token 20 is trained on: --seq-len 16 cuts it off.
  const std::string cut = write("cut.jsonl", {example(24, 20), example(30, 20)});
  std::ofstream(path("mask.jsonl")) << R"({"input_ids": [5, 6, 7], "assistant_mask": [0, 0, 0]})"
                                    << "\n";
  const fs::path model = init("m", {"--layers", "1"});
  for (const std::string& data : {masked, one_token, cut, path("mask.jsonl").string()}) {
    for (const bool eval : {false, true}) {
      const RunResult r = eval ? run({"eval", "--model", model.string(), "--data", data,
                                      "--seq-len", "16", "--batch", "2"})
                               : run(quick({"--steps", "3", "--data", data}));
      EXPECT_EQ(r.rc, 1) << data << ": " << r.err;
      EXPECT_TRUE(contains(r.err, "nothing to train on")) << r.err;
      EXPECT_TRUE(contains(r.err, "[" + data + "]")) << r.err;
      EXPECT_FALSE(contains(r.err, "step 1/")) << r.err;
    }
  }
  const RunResult r = run(quick({"--steps", "3", "--data", cut}));
  EXPECT_TRUE(contains(r.err, "2 cut to --seq-len 16")) << r.err;
  EXPECT_TRUE(contains(r.err, "a longer --seq-len keeps more")) << r.err;
}

TEST_F(CliNoTargets, BatchesWithoutTargetsAreSkippedCountedAndKeptOutOfTheDivergenceMean) {
  std::vector<SftExample> examples;
  for (int i = 0; i < 5; ++i) examples.push_back(example(12, 0, 1 + i));
  for (int i = 0; i < 30; ++i) examples.push_back(example(12, 12, 2 + i));
  for (int i = 0; i < 30; ++i) examples.push_back(example(12, 0, 3 + i));
  const std::string data = write("mixed.jsonl", examples);
  const RunResult r = run({"train", "--layers", "1", "--threads", "1", "--seq-len", "16", "--data",
                           data, "--no-packing", "--no-shuffle", "--batch", "1", "--lr", "1e-4",
                           "--steps", "60", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  // 35 steps take the 35 examples with targets; the next epoch's 5, then 20.
  const nlohmann::json summary = last_json_line(r.out);
  EXPECT_EQ(summary.at("steps"), 60);
  EXPECT_EQ(summary.at("skipped_batches"), 60);
  EXPECT_EQ(count_of(r.err, "skipped a batch whose rows hold no counted target"), 1) << r.err;
  EXPECT_TRUE(contains(r.err, "60 batch(es) without a counted target skipped")) << r.err;
  for (const double loss : summary.at("losses")) EXPECT_GT(loss, 1.0);
}

}  // namespace
}  // namespace tiermoe
