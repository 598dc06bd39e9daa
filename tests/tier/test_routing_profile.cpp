#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "tiermoe/core/error.h"
#include "tiermoe/tier/routing_profile.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("tiermoe_test_routing_profile_" + name);
}

// The Error's full text (what, where, hint) for a bad profile text.
std::string load_error(const std::string& text) {
  try {
    RoutingProfile::from_json(text, "bad.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// "layers" and "experts" are checked against the rows before anything is
// allocated, so a claimed 10^12 layers is an Error, not a 24 TB vector.
TEST(RoutingProfile, HugeLayerOrExpertCountsAreErrorsNotAllocations) {
  for (const char* dims : {R"("layers": 1000000000000, "experts": 2)",
                           R"("layers": 1, "experts": 4611686018427387904)"}) {
    const std::string text = std::string(R"({"format": "tiermoe-routing-profile", "version": 1,
        "decay": 0.9, "steps": 1, )") + dims + R"(, "rows": [[1, 2]]})";
    const std::string err = load_error(text);
    EXPECT_NE(err.find("must"), std::string::npos) << dims << ": " << err;
  }
}

TEST(RoutingProfile, FirstStepIsTheCountsAndMicroBatchesAddUp) {
  RoutingProfile p(2, 3, 0.9);
  p.observe(0, {1, 2, 3});
  p.observe(0, {4, 0, 1});  // a second micro-batch of the same step
  p.observe(1, {0, 7, 0});
  p.end_step();
  EXPECT_EQ(p.steps(), 1);
  EXPECT_EQ(p.rows(0), (std::vector<double>{5, 2, 4}));
  EXPECT_EQ(p.rows(1), (std::vector<double>{0, 7, 0}));
  EXPECT_EQ(p.total_rows(0), 11);
  EXPECT_EQ(p.drift(), 0);
}

TEST(RoutingProfile, LaterStepsFoldIntoTheAverage) {
  const double decay = 0.75;
  RoutingProfile p(1, 2, decay);
  p.observe(0, {8, 0});
  p.end_step();
  p.observe(0, {0, 4});
  p.end_step();
  EXPECT_DOUBLE_EQ(p.rows(0)[0], decay * 8);
  EXPECT_DOUBLE_EQ(p.rows(0)[1], (1 - decay) * 4);
  // Step counts were cleared: a step with no rows only decays the average.
  p.end_step();
  EXPECT_DOUBLE_EQ(p.rows(0)[0], decay * decay * 8);
  EXPECT_DOUBLE_EQ(p.rows(0)[1], decay * (1 - decay) * 4);
  EXPECT_EQ(p.steps(), 3);
}

TEST(RoutingProfile, DriftIsTheMeanL1DistanceOfNormalisedLayers) {
  RoutingProfile p(2, 2, 0.5);
  p.observe(0, {10, 0});
  p.observe(1, {3, 3});
  p.end_step();
  // Layer 0's hot expert swaps: [1, 0] -> ema [5, 5] -> [0.5, 0.5], L1 = 1.
  // Layer 1 keeps its shape (its scale changes, its normalised profile not).
  p.observe(0, {0, 10});
  p.observe(1, {30, 30});
  p.end_step();
  EXPECT_DOUBLE_EQ(p.drift(), (1.0 + 0.0) / 2);
  // Same routing again: the average moves towards [0, 1] by half the way.
  p.observe(0, {0, 10});
  p.observe(1, {30, 30});
  p.end_step();
  EXPECT_DOUBLE_EQ(p.drift(), (0.5 + 0.0) / 2);
}

TEST(RoutingProfile, EmptyLayerNormalisesToZeros) {
  RoutingProfile p(1, 2, 0.0);
  p.observe(0, {0, 0});
  p.end_step();
  p.observe(0, {2, 2});
  p.end_step();
  EXPECT_DOUBLE_EQ(p.drift(), 1.0);  // |0 - 0.5| + |0 - 0.5|
}

TEST(RoutingProfile, SaveLoadRoundTripsExactly) {
  RoutingProfile p(3, 5, 0.9);
  for (int step = 0; step < 4; ++step) {
    for (int64_t l = 0; l < 3; ++l) {
      std::vector<int64_t> c(5);
      for (int64_t e = 0; e < 5; ++e) c[size_t(e)] = (step * 7 + l * 3 + e * 5) % 11;
      p.observe(l, c);
    }
    p.end_step();
  }
  const fs::path path = temp_path("roundtrip.json");
  p.save(path.string());
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  RoutingProfile q = RoutingProfile::load(path.string());
  fs::remove(path);
  EXPECT_EQ(q, p);
  EXPECT_EQ(q.drift(), p.drift());
  EXPECT_EQ(q.steps(), 4);
}

TEST(RoutingProfile, DriftFieldIsOptional) {
  RoutingProfile p = RoutingProfile::from_json(
      R"({"format": "tiermoe-routing-profile", "version": 1, "decay": 0.5, "steps": 2,
          "layers": 1, "experts": 2, "rows": [[1.5, 0]]})",
      "hand.json");
  EXPECT_EQ(p.rows(0), (std::vector<double>{1.5, 0}));
  EXPECT_EQ(p.drift(), 0);
  EXPECT_EQ(p.decay(), 0.5);
}

TEST(RoutingProfile, RejectsBadFilesNamingTheFieldAndFile) {
  const std::string head =
      R"("format": "tiermoe-routing-profile", "version": 1, "decay": 0.9, "steps": 1, )";
  struct Case {
    std::string text, want;
  };
  const Case cases[] = {
      {"not json", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"format": "something-else"})", "\"format\""},
      {R"({"format": "tiermoe-routing-profile", "version": 2})", "version 2 is not supported"},
      {"{" + head + R"("layers": 1, "experts": 2})", "no \"rows\" field"},
      {"{" + head + R"("layers": 2, "experts": 2, "rows": [[1, 2]]})", "array of 2 layers"},
      {"{" + head + R"("layers": 1, "experts": 2, "rows": [[1, 2, 3]]})", "must list 2 experts"},
      {"{" + head + R"("layers": 1, "experts": 2, "rows": [[1, -2]]})", "expert 1 has -2 rows"},
      {"{" + head + R"("layers": 1, "experts": 2, "rows": [[1, "x"]]})", "is not a number"},
      {"{" + head + R"("layers": "1", "experts": 2, "rows": [[1, 2]]})",
       "\"layers\" is not an integer"},
      {"{" + head + R"("layers": 0, "experts": 2, "rows": []})", "must be positive"},
      {R"({"format": "tiermoe-routing-profile", "version": 1, "decay": 1.0, "steps": 1,
           "layers": 1, "experts": 1, "rows": [[1]]})",
       "decay 1 is outside [0, 1)"},
      {R"({"format": "tiermoe-routing-profile", "version": 1, "decay": 0.9, "steps": 0,
           "layers": 1, "experts": 1, "rows": [[1]]})",
       "after 0 steps"},
  };
  for (const Case& c : cases) {
    const std::string got = load_error(c.text);
    EXPECT_NE(got.find(c.want), std::string::npos) << c.text << "\n -> " << got;
    EXPECT_NE(got.find("bad.json"), std::string::npos) << got;
    EXPECT_NE(got.find("hint:"), std::string::npos) << got;
  }
}

TEST(RoutingProfile, LoadOfAMissingFileNamesIt) {
  try {
    RoutingProfile::load("/nonexistent/profile.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "/nonexistent/profile.json");
  }
}

TEST(RoutingProfile, ObserveRejectsAWrongShape) {
  RoutingProfile p(2, 3);
  EXPECT_THROW(p.observe(2, {1, 2, 3}), Error);
  EXPECT_THROW(p.observe(0, {1, 2}), Error);
  EXPECT_THROW(RoutingProfile(0, 3), Error);
  EXPECT_THROW(RoutingProfile(1, 3, 1.0), Error);
}

TEST(RoutingProfile, SyntheticIsZipfPerLayerAndDeterministic) {
  const int64_t L = 3, E = 16;
  const double total = 1000, s = 1.2;
  RoutingProfile a = RoutingProfile::synthetic(L, E, total, s, 7);
  EXPECT_EQ(a, RoutingProfile::synthetic(L, E, total, s, 7));
  EXPECT_NE(a, RoutingProfile::synthetic(L, E, total, s, 8));
  EXPECT_EQ(a.steps(), 1);
  double harmonic = 0;
  for (int64_t r = 0; r < E; ++r) harmonic += std::pow(double(r + 1), -s);
  for (int64_t l = 0; l < L; ++l) {
    std::vector<double> sorted = a.rows(l);
    std::sort(sorted.rbegin(), sorted.rend());
    EXPECT_NEAR(a.total_rows(l), total, 1e-9);
    for (int64_t r = 0; r < E; ++r) {
      EXPECT_NEAR(sorted[size_t(r)], total * std::pow(double(r + 1), -s) / harmonic, 1e-9);
    }
  }
  // The layers do not share one order of experts.
  EXPECT_NE(a.rows(0), a.rows(1));
  // s = 0: uniform.
  RoutingProfile u = RoutingProfile::synthetic(1, 4, 100, 0, 1);
  EXPECT_EQ(u.rows(0), (std::vector<double>{25, 25, 25, 25}));
}

// Top-k routing gives an expert at most one row per token: Qwen3-30B-A3B's
// 128 experts, top 8 of 4096 tokens at s = 1 gave the top expert 6,031 rows.
// The capped ranks keep the cap, the rest share what is left by the Zipf
// weights; with s so large the weights vanish, the top k take every token.
TEST(RoutingProfile, SyntheticHoldsEachExpertToOneRowAToken) {
  const double tokens = 4096, k = 8;
  const RoutingProfile a = RoutingProfile::synthetic(1, 128, tokens * k, 1.0, 3, tokens);
  std::vector<double> sorted = a.rows(0);
  std::sort(sorted.rbegin(), sorted.rend());
  EXPECT_NEAR(a.total_rows(0), tokens * k, 1e-6);
  EXPECT_EQ(sorted[0], tokens);
  EXPECT_LT(sorted[1], tokens);
  // Below the cap the Zipf ratios hold: rank 1 to rank 2 is (3/2)^1.
  EXPECT_NEAR(sorted[1] / sorted[2], 1.5, 1e-9);
  EXPECT_EQ(RoutingProfile::synthetic(1, 128, tokens * k, 1.0, 3),
            RoutingProfile::synthetic(1, 128, tokens * k, 1.0, 3, 1e300))
      << "a cap above every share changes nothing";

  const RoutingProfile extreme = RoutingProfile::synthetic(1, 128, tokens * k, 1e300, 3, tokens);
  sorted = extreme.rows(0);
  std::sort(sorted.rbegin(), sorted.rend());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(sorted[size_t(r)], tokens) << r;
  EXPECT_EQ(sorted[8], 0);
  EXPECT_THROW(RoutingProfile::synthetic(1, 4, 5 * tokens, 1.0, 3, tokens), Error);
}

}  // namespace
}  // namespace tiermoe
