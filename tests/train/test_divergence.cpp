// The divergence rule on loss and grad-norm sequences: a blow-up or a dead
// model lasting `patience` steps stops the run naming the step; noise, a
// falling loss, a shorter spike and a healthy start at chance do not; a
// resumed run's replayed losses continue the count.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tiermoe/core/error.h"
#include "tiermoe/train/divergence.h"

namespace tiermoe {
namespace {

constexpr int64_t kVocab = 256;  // chance: ln 256 = 5.545

// The step at which the guard stops the sequence, or 0 when it never does.
int64_t stops_at(DivergenceGuard& g, const std::vector<double>& losses,
                 const std::vector<double>& norms, int64_t first_step = 1,
                 std::string* message = nullptr) {
  for (size_t i = 0; i < losses.size(); ++i) {
    try {
      g.observe(first_step + int64_t(i), losses[i], norms[i]);
    } catch (const Error& e) {
      if (message) *message = e.what();
      return first_step + int64_t(i);
    }
  }
  return 0;
}

// A training curve: from chance down toward 1.7, with +-30% batch noise.
std::vector<double> healthy(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> noise(-0.3, 0.3);
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) {
    out.push_back((1.7 + 3.85 * std::exp(-double(i) / 50)) * (1 + noise(rng)));
  }
  return out;
}

TEST(Divergence, AHealthyNoisyRunNeverStops) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    DivergenceGuard g({}, kVocab);
    const std::vector<double> losses = healthy(2000, seed);
    EXPECT_EQ(stops_at(g, losses, std::vector<double>(losses.size(), 1.0)), 0) << seed;
  }
}

TEST(Divergence, ABlowUpLastingPatienceStepsStopsAtItsLastStep) {
  std::vector<double> losses(100, 2.0), norms(100, 0.5);
  for (int i = 50; i < 100; ++i) losses[size_t(i)] = 6.5;  // from step 51 on
  DivergenceGuard g({.patience = 10}, kVocab);
  std::string message;
  EXPECT_EQ(stops_at(g, losses, norms, 1, &message), 60);
  EXPECT_NE(message.find("diverged at step 60"), std::string::npos) << message;
  EXPECT_NE(message.find("running mean (2)"), std::string::npos) << message;
  EXPECT_NE(message.find("--divergence-patience 0"), std::string::npos) << message;

  // Nine suspect steps, then back to normal: no stop.
  for (int i = 59; i < 100; ++i) losses[size_t(i)] = 2.0;
  DivergenceGuard h({.patience = 10}, kVocab);
  EXPECT_EQ(stops_at(h, losses, norms), 0);
}

TEST(Divergence, BothConditionsOfTheBlowUpAreNeeded) {
  // Twice the mean but less than 1 nat above it (a small loss doubling).
  std::vector<double> low(60, 0.3), norms(60, 0.5);
  for (int i = 20; i < 60; ++i) low[size_t(i)] = 0.9;
  DivergenceGuard g({.patience = 5}, kVocab);
  EXPECT_EQ(stops_at(g, low, norms), 0);
  // 1 nat above but under the factor.
  std::vector<double> high(60, 4.0);
  for (int i = 20; i < 60; ++i) high[size_t(i)] = 5.5;
  DivergenceGuard h({.patience = 5}, kVocab);
  EXPECT_EQ(stops_at(h, high, norms), 0);
  // The factor is the flag's.
  DivergenceGuard f({.patience = 5, .factor = 1.3}, kVocab);
  EXPECT_EQ(stops_at(f, high, norms), 25);
}

TEST(Divergence, ADeadModelAtChanceStops) {
  const double chance = std::log(double(kVocab));
  std::vector<double> losses(40, chance), dead(40, 0.0), alive(40, 0.8);
  DivergenceGuard g({.patience = 10}, kVocab);
  std::string message;
  EXPECT_EQ(stops_at(g, losses, dead, 1, &message), 10);
  EXPECT_NE(message.find("at chance"), std::string::npos) << message;
  EXPECT_NE(message.find("vanished gradient"), std::string::npos) << message;
  // At chance with a gradient: the healthy start of every run.
  DivergenceGuard h({.patience = 10}, kVocab);
  EXPECT_EQ(stops_at(h, losses, alive), 0);
  // No gradient with a low loss: a model that has learned its data.
  DivergenceGuard k({.patience = 10}, kVocab);
  EXPECT_EQ(stops_at(k, std::vector<double>(40, 0.01), dead), 0);
}

TEST(Divergence, PatienceZeroNeverStops) {
  DivergenceGuard g({.patience = 0}, kVocab);
  std::vector<double> losses(50, 2.0);
  for (int i = 5; i < 50; ++i) losses[size_t(i)] = 50;
  EXPECT_EQ(stops_at(g, losses, std::vector<double>(50, 0.0)), 0);
}

TEST(Divergence, ReplayedLossesContinueTheCount) {
  std::vector<double> history(30, 2.0);
  for (int i = 24; i < 30; ++i) history[size_t(i)] = 7.0;  // 6 suspect steps before the resume
  DivergenceGuard g({.patience = 10}, kVocab);
  g.replay(history);
  EXPECT_DOUBLE_EQ(g.mean(), 2.0) << "the blow-up stays out of the mean";
  EXPECT_EQ(stops_at(g, std::vector<double>(10, 7.0), std::vector<double>(10, 0.5), 31), 34);
}

TEST(Divergence, BadOptionsAreRefusedNamingTheFlag) {
  for (const DivergenceOptions& o :
       {DivergenceOptions{.patience = -1}, DivergenceOptions{.factor = 1.0},
        DivergenceOptions{.factor = NAN}}) {
    try {
      DivergenceGuard g(o, kVocab);
      FAIL() << "accepted patience " << o.patience << " factor " << o.factor;
    } catch (const Error& e) {
      EXPECT_NE(e.where().find("--divergence-"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tiermoe
