// The built-in Markov corpus: its stationary distribution is a fixed point,
// its exact entropy rate agrees with estimates from long samples, and it is
// deterministic per seed.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tiermoe/core/error.h"
#include "tiermoe/train/markov_corpus.h"

namespace tiermoe {
namespace {

// The per-token negative log-likelihood of a sample under the true chain:
// its mean is an unbiased estimate of the entropy rate. Returns the mean and
// its standard error (from the sample variance; the chain mixes within a few
// steps, so treating the terms as independent understates the error only
// slightly, and the tests allow 5 standard errors).
struct Estimate {
  double mean, stderr_;
};
Estimate true_model_nll(const MarkovCorpus& c, const std::vector<int32_t>& s) {
  double sum = 0.0, sum_sq = 0.0;
  const double n = static_cast<double>(s.size() - 1);
  for (size_t t = 0; t + 1 < s.size(); ++t) {
    const double x = -std::log(c.transition(s[t], s[t + 1]));
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / n;
  return {mean, std::sqrt((sum_sq / n - mean * mean) / n)};
}

TEST(MarkovCorpus, RowsAreDistributionsWithTheirLikelySuccessors) {
  MarkovCorpus c;
  const int64_t V = c.vocab();
  const double floor = c.options().smoothing / static_cast<double>(V);
  for (int64_t i = 0; i < V; ++i) {
    double sum = 0.0;
    int64_t likely = 0;
    for (int64_t j = 0; j < V; ++j) {
      const double p = c.transition(i, j);
      EXPECT_GE(p, floor * (1 - 1e-12)) << i << " -> " << j;
      sum += p;
      likely += p > 2 * floor;  // the smallest Zipf share, (1 - 0.02) / 8 / H_8, is far above 2 * floor
    }
    EXPECT_NEAR(sum, 1.0, 1e-12) << "row " << i;
    EXPECT_GE(likely, c.options().min_successors) << "row " << i;
    EXPECT_LE(likely, c.options().max_successors) << "row " << i;
  }
}

TEST(MarkovCorpus, StationaryDistributionIsAFixedPoint) {
  MarkovCorpus c;
  const int64_t V = c.vocab();
  const auto pi = c.stationary();
  double total = 0.0;
  for (int64_t j = 0; j < V; ++j) {
    double pi_p = 0.0;
    for (int64_t i = 0; i < V; ++i) pi_p += pi[i] * c.transition(i, j);
    EXPECT_NEAR(pi_p, pi[j], 1e-12) << "state " << j;
    EXPECT_GT(pi[j], 0.0) << "state " << j;
    total += pi[j];
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
}

TEST(MarkovCorpus, TrueModelLossOnALongSampleMatchesTheEntropyRate) {
  MarkovCorpus c;
  const auto sample = c.generate(1'000'000, 11);
  const Estimate e = true_model_nll(c, sample);
  EXPECT_NEAR(c.cross_entropy(sample), e.mean, 1e-12);
  EXPECT_NEAR(e.mean, c.entropy_rate(), 5 * e.stderr_) << "stderr " << e.stderr_;
  EXPECT_EQ(c.loss_floor(), c.entropy_rate());
  // The context is worth something: the floor is far below the unigram loss.
  EXPECT_LT(c.entropy_rate() + 2.0, c.unigram_entropy());
}

// The plug-in estimate from bigram counts, H_plug = -sum_ij n_ij/N ln(n_ij/n_i),
// is biased low by about (M - V) / (2N), M the number of distinct transitions
// seen (Miller-Madow). That bias formula holds when every transition is seen
// many times, so this uses a 32-state chain: its 1024 transitions each occur
// >= ~20 times in 10^6 tokens, the bias is ~5e-4 nats and the sampling error
// ~1.5e-3. (With 256 states most smoothing transitions occur 0-1 times and the
// plug-in is ~0.025 nats low, 2.7x what Miller-Madow predicts.) Tolerance:
// |H_plug + (M - V)/(2N) - H| <= 5 standard errors of the true-model estimate.
TEST(MarkovCorpus, PluginBigramEntropyMatchesTheEntropyRate) {
  MarkovCorpus c({.vocab = 32, .seed = 5});
  const int64_t V = c.vocab();
  const auto sample = c.generate(1'000'000, 3);
  const double N = static_cast<double>(sample.size() - 1);
  std::vector<double> count_VV(V * V, 0.0), count_V(V, 0.0);
  for (size_t t = 0; t + 1 < sample.size(); ++t) {
    count_VV[sample[t] * V + sample[t + 1]] += 1;
    count_V[sample[t]] += 1;
  }
  double plugin = 0.0;
  int64_t seen = 0, rows = 0;
  for (int64_t i = 0; i < V; ++i) {
    rows += count_V[i] > 0;
    for (int64_t j = 0; j < V; ++j) {
      const double n_ij = count_VV[i * V + j];
      if (n_ij == 0) continue;
      ++seen;
      plugin -= n_ij / N * std::log(n_ij / count_V[i]);
    }
  }
  const double bias = static_cast<double>(seen - rows) / (2 * N);
  const Estimate e = true_model_nll(c, sample);
  EXPECT_NEAR(plugin + bias, c.entropy_rate(), 5 * e.stderr_)
      << "plug-in " << plugin << " bias " << bias << " stderr " << e.stderr_;
}

// Token frequencies follow pi. Successive tokens are correlated, which can
// inflate the variance of a frequency by a small factor over the binomial
// one; 8 binomial standard deviations leaves room for it.
TEST(MarkovCorpus, TokenFrequenciesFollowTheStationaryDistribution) {
  MarkovCorpus c;
  const int64_t V = c.vocab(), N = 1'000'000;
  std::vector<double> count_V(V, 0.0);
  for (int32_t t : c.generate(N, 21)) count_V[t] += 1;
  for (int64_t j = 0; j < V; ++j) {
    const double pi = c.stationary()[j];
    EXPECT_NEAR(count_V[j] / N, pi, 8 * std::sqrt(pi * (1 - pi) / N)) << "state " << j;
  }
}

TEST(MarkovCorpus, DeterministicPerSeed) {
  MarkovCorpus a, b;
  EXPECT_EQ(a.generate(5000, 7), b.generate(5000, 7));
  EXPECT_EQ(a.entropy_rate(), b.entropy_rate());
  EXPECT_NE(a.generate(5000, 7), a.generate(5000, 8));
  // A prefix is the same whatever the length asked for.
  const auto long_sample = a.generate(5000, 7);
  EXPECT_EQ(a.generate(100, 7), std::vector<int32_t>(long_sample.begin(), long_sample.begin() + 100));

  MarkovCorpus other({.seed = 1});
  EXPECT_NE(other.entropy_rate(), a.entropy_rate());
  EXPECT_NE(other.generate(5000, 7), a.generate(5000, 7));
  for (int32_t t : other.generate(5000, 7)) ASSERT_TRUE(t >= 0 && t < other.vocab()) << t;
}

TEST(MarkovCorpus, RejectsBadOptionsAndTokens) {
  EXPECT_THROW(MarkovCorpus({.vocab = 1}), Error);
  EXPECT_THROW(MarkovCorpus({.vocab = kMaxMarkovVocab + 1}), Error);
  EXPECT_THROW(MarkovCorpus({.min_successors = 5, .max_successors = 4}), Error);
  EXPECT_THROW(MarkovCorpus({.vocab = 4, .min_successors = 2, .max_successors = 5}), Error);
  EXPECT_THROW(MarkovCorpus({.zipf_exponent = -1.0}), Error);
  EXPECT_THROW(MarkovCorpus({.smoothing = 0.0}), Error);
  EXPECT_THROW(MarkovCorpus({.smoothing = 1.5}), Error);
  MarkovCorpus c({.vocab = 8, .min_successors = 1, .max_successors = 2});
  EXPECT_THROW(c.generate(-1, 0), Error);
  EXPECT_TRUE(c.generate(0, 0).empty());
  const std::vector<int32_t> bad = {1, 2, 8};
  EXPECT_THROW(c.cross_entropy(bad), Error);
}

}  // namespace
}  // namespace tiermoe
