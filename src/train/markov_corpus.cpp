#include "tiermoe/train/markov_corpus.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tiermoe/core/error.h"
#include "tiermoe/core/random.h"

namespace tiermoe {

namespace {

constexpr const char* kWhere = "built-in Markov corpus";

double entropy_of(const double* p, int64_t n) {
  double h = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (p[j] > 0.0) h -= p[j] * std::log(p[j]);
  }
  return h;
}

// Running sums with the last entry pinned to 1, so inverse-CDF sampling with
// u in [0, 1) always lands inside the row despite rounding.
void running_sums(double* cdf, const double* p, int64_t n) {
  double s = 0.0;
  for (int64_t j = 0; j < n; ++j) cdf[j] = (s += p[j]);
  cdf[n - 1] = 1.0;
}

void check_options(const MarkovCorpusOptions& o) {
  using detail::str_of;
  TIERMOE_CHECK(o.vocab >= 2 && o.vocab <= kMaxMarkovVocab,
                str_of("vocab ", o.vocab, " is outside [2, ", kMaxMarkovVocab, "]"), kWhere,
                "the corpus only needs a few hundred states; a larger model vocabulary can train on it");
  TIERMOE_CHECK(o.min_successors >= 1 && o.min_successors <= o.max_successors && o.max_successors <= o.vocab,
                str_of("successors per state [", o.min_successors, ", ", o.max_successors,
                       "] must satisfy 1 <= min <= max <= vocab (", o.vocab, ")"),
                kWhere, "use e.g. 4 and 8");
  TIERMOE_CHECK(std::isfinite(o.zipf_exponent) && o.zipf_exponent >= 0.0,
                str_of("zipf_exponent ", o.zipf_exponent, " must be finite and >= 0"), kWhere,
                "0 makes the likely successors equally likely; 1 is the default");
  TIERMOE_CHECK(o.smoothing > 0.0 && o.smoothing <= 1.0, str_of("smoothing ", o.smoothing, " is outside (0, 1]"),
                kWhere, "smoothing > 0 keeps the chain irreducible and aperiodic, so its entropy rate is defined");
}

}  // namespace

MarkovCorpus::MarkovCorpus(MarkovCorpusOptions options) : options_(options) {
  check_options(options_);
  const int64_t V = options_.vocab;
  Rng rng(options_.seed);

  p_VV_.assign(V * V, options_.smoothing / static_cast<double>(V));
  std::vector<int32_t> states(V);
  for (int64_t i = 0; i < V; ++i) {
    const int64_t span = options_.max_successors - options_.min_successors + 1;
    const int64_t k = options_.min_successors + static_cast<int64_t>(rng.below(static_cast<uint64_t>(span)));
    std::iota(states.begin(), states.end(), 0);
    std::vector<double> w(k);
    for (int64_t r = 0; r < k; ++r) {
      const int64_t pick = r + static_cast<int64_t>(rng.below(static_cast<uint64_t>(V - r)));
      std::swap(states[r], states[pick]);
      w[r] = std::pow(static_cast<double>(r + 1), -options_.zipf_exponent);
    }
    const double w_sum = std::accumulate(w.begin(), w.end(), 0.0);
    for (int64_t r = 0; r < k; ++r) {
      p_VV_[i * V + states[r]] += (1.0 - options_.smoothing) * w[r] / w_sum;
    }
  }

  cdf_VV_.resize(V * V);
  for (int64_t i = 0; i < V; ++i) running_sums(&cdf_VV_[i * V], &p_VV_[i * V], V);

  // Power iteration pi <- pi P. Every entry of P is >= smoothing / V, so the
  // error shrinks at least by (1 - smoothing) per step; the cap is a bug net.
  pi_V_.assign(V, 1.0 / static_cast<double>(V));
  std::vector<double> next(V);
  const int64_t max_iters =
      static_cast<int64_t>(std::ceil(40.0 / -std::log1p(-std::min(options_.smoothing, 0.999)))) + 100;
  double change = 1.0;
  for (int64_t it = 0; it < max_iters && change > 1e-16; ++it) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t i = 0; i < V; ++i) {
      const double pi_i = pi_V_[i];
      const double* row = &p_VV_[i * V];
      for (int64_t j = 0; j < V; ++j) next[j] += pi_i * row[j];
    }
    const double total = std::accumulate(next.begin(), next.end(), 0.0);
    change = 0.0;
    for (int64_t j = 0; j < V; ++j) {
      next[j] /= total;
      change = std::max(change, std::abs(next[j] - pi_V_[j]));
    }
    pi_V_.swap(next);
  }
  TIERMOE_ASSERT(change <= 1e-14, "power iteration did not converge: change ", change);

  pi_cdf_V_.resize(V);
  running_sums(pi_cdf_V_.data(), pi_V_.data(), V);

  for (int64_t i = 0; i < V; ++i) entropy_rate_ += pi_V_[i] * entropy_of(&p_VV_[i * V], V);
}

int32_t MarkovCorpus::sample_row(const double* cdf_V, double u) const {
  const double* hit = std::upper_bound(cdf_V, cdf_V + options_.vocab, u);
  return static_cast<int32_t>(hit - cdf_V);
}

std::vector<int32_t> MarkovCorpus::generate(int64_t n_tokens, uint64_t seed,
                                            ProgressSink progress) const {
  TIERMOE_CHECK(n_tokens >= 0, detail::str_of("cannot generate ", n_tokens, " tokens"), kWhere,
                "ask for a non-negative count");
  std::vector<int32_t> out(n_tokens);
  if (n_tokens == 0) return out;
  ProgressMeter meter(progress, "sample the built-in corpus", double(n_tokens),
                      ProgressMeterOptions{.unit = "tokens"});
  Rng rng(seed);
  const int64_t V = options_.vocab;
  out[0] = sample_row(pi_cdf_V_.data(), rng.uniform());
  constexpr int64_t kChunk = int64_t(1) << 20;
  for (int64_t t = 1; t < n_tokens; ++t) {
    out[t] = sample_row(&cdf_VV_[out[t - 1] * V], rng.uniform());
    if (t % kChunk == 0) meter.update(double(t));
  }
  meter.update(double(n_tokens));
  meter.finish();
  return out;
}

double MarkovCorpus::unigram_entropy() const { return entropy_of(pi_V_.data(), options_.vocab); }

double MarkovCorpus::cross_entropy(std::span<const int32_t> tokens) const {
  TIERMOE_CHECK(tokens.size() >= 2, "cross_entropy needs at least two tokens", kWhere,
                "pass a sample with at least one transition");
  const int64_t V = options_.vocab;
  double nll = 0.0;
  for (size_t t = 0; t + 1 < tokens.size(); ++t) {
    const int32_t a = tokens[t], b = tokens[t + 1];
    TIERMOE_CHECK(a >= 0 && a < V && b >= 0 && b < V,
                  detail::str_of("token ", (a >= 0 && a < V) ? b : a, " at offset ", (a >= 0 && a < V) ? t + 1 : t,
                                 " is outside [0, ", V, ")"),
                  kWhere, "score samples drawn from this corpus's vocabulary");
    nll -= std::log(p_VV_[a * V + b]);
  }
  return nll / static_cast<double>(tokens.size() - 1);
}

}  // namespace tiermoe
