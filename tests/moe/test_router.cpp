// Routers: an independent per-token re-implementation, f64 finite-difference
// gradients, tie-breaking, and configuration errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>  // common/testing.h uses std::memcmp
#include <numeric>

#include "common/testing.h"
#include "tiermoe/moe/router.h"

namespace tiermoe {
namespace {

using testing::all_close;
using testing::fd_check;
using testing::random_tensor;

RouterConfig softmax_cfg(int64_t D, int64_t E, int64_t K, bool norm) {
  RouterConfig c;
  c.kind = RouterKind::softmax_topk;
  c.hidden = D, c.num_experts = E, c.top_k = K, c.norm_topk_prob = norm;
  return c;
}

RouterConfig deepseek_cfg(int64_t D, int64_t E, int64_t K, int64_t groups, int64_t keep,
                          bool norm, double scale) {
  RouterConfig c;
  c.kind = RouterKind::deepseek_v3;
  c.hidden = D, c.num_experts = E, c.top_k = K, c.norm_topk_prob = norm;
  c.n_group = groups, c.topk_group = keep, c.routed_scaling_factor = scale;
  return c;
}

RouterConfig deepseek_v2_cfg(int64_t D, int64_t E, int64_t K, int64_t groups, int64_t keep,
                             double scale) {
  RouterConfig c;
  c.kind = RouterKind::deepseek_v2;
  c.hidden = D, c.num_experts = E, c.top_k = K;
  c.n_group = groups, c.topk_group = keep, c.routed_scaling_factor = scale;
  return c;
}

RouterConfig gpt_oss_cfg(int64_t D, int64_t E, int64_t K) {
  RouterConfig c;
  c.kind = RouterKind::gpt_oss;
  c.hidden = D, c.num_experts = E, c.top_k = K;
  return c;
}

void fill_params(Router& router, Rng& rng) {
  for (const std::string& name : router.param_names()) {
    fill_normal(router.param(name), rng, 0.0, name == "weight" ? 0.5 : 0.3);
  }
}

// ---- The independent reference: one token at a time, written as plainly as possible.

// Indices sorted by descending score; stable, so equal scores keep ascending ids.
template <class S>
std::vector<int32_t> sorted_ids(const std::vector<S>& score) {
  std::vector<int32_t> ids(score.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
  return ids;
}

template <class S>
std::vector<S> plain_softmax(const std::vector<S>& x) {
  S m = *std::max_element(x.begin(), x.end());
  std::vector<S> y(x.size());
  S sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += y[i] = std::exp(x[i] - m);
  for (S& v : y) v = v / sum;
  return y;
}

// Returns ids and weights of one token; logits are computed here too.
template <class S>
std::pair<std::vector<int32_t>, std::vector<S>> reference_route(const Router& router,
                                                                const Tensor& x_TD, int64_t t) {
  const RouterConfig& c = router.config();
  const int64_t E = c.num_experts, D = c.hidden, K = c.top_k;
  const Tensor& w = router.param("weight");
  std::vector<S> logit(E);
  for (int64_t e = 0; e < E; ++e) {
    S acc = 0;
    for (int64_t d = 0; d < D; ++d) acc += S(x_TD.get(t * D + d)) * S(w.get(e * D + d));
    if (c.kind == RouterKind::gpt_oss) acc += S(router.param("bias").get(e));
    logit[e] = acc;
  }
  std::vector<int32_t> ids;
  std::vector<S> weight;
  if (c.kind == RouterKind::softmax_topk) {
    std::vector<S> p = plain_softmax(logit);
    ids = sorted_ids(p);
    ids.resize(K);
    S sum = 0;
    for (int32_t id : ids) sum += p[id];
    for (int32_t id : ids) weight.push_back(c.norm_topk_prob ? p[id] / sum : p[id]);
  } else if (c.kind == RouterKind::deepseek_v2) {
    std::vector<S> p = plain_softmax(logit), choice = p;
    const int64_t per = E / c.n_group;
    std::vector<S> group(c.n_group);
    for (int64_t g = 0; g < c.n_group; ++g) {
      group[g] = *std::max_element(p.begin() + g * per, p.begin() + (g + 1) * per);
    }
    std::vector<int32_t> groups = sorted_ids(group);
    for (int64_t e = 0; e < E; ++e) {
      if (std::find(groups.begin(), groups.begin() + c.topk_group, e / per) ==
          groups.begin() + c.topk_group) {
        choice[e] = 0;
      }
    }
    ids = sorted_ids(choice);
    ids.resize(K);
    for (int32_t id : ids) weight.push_back(p[id] * S(c.routed_scaling_factor));
  } else if (c.kind == RouterKind::gpt_oss) {
    ids = sorted_ids(logit);
    ids.resize(K);
    std::vector<S> chosen;
    for (int32_t id : ids) chosen.push_back(logit[id]);
    weight = plain_softmax(chosen);
  } else {
    std::vector<S> s(E), biased(E);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = S(1) / (S(1) + std::exp(-logit[e]));
      biased[e] = s[e] + S(router.param("e_score_correction_bias").get(e));
    }
    const int64_t per = E / c.n_group;
    std::vector<S> group(c.n_group);
    for (int64_t g = 0; g < c.n_group; ++g) {
      std::vector<S> members(biased.begin() + g * per, biased.begin() + (g + 1) * per);
      std::sort(members.rbegin(), members.rend());
      group[g] = members[0] + members[1];
    }
    std::vector<int32_t> groups = sorted_ids(group);
    for (int64_t e = 0; e < E; ++e) {
      bool kept = std::find(groups.begin(), groups.begin() + c.topk_group, e / per) !=
                  groups.begin() + c.topk_group;
      if (!kept) biased[e] = 0;
    }
    ids = sorted_ids(biased);
    ids.resize(K);
    S sum = 0;
    for (int32_t id : ids) sum += s[id];
    for (int32_t id : ids) {
      S v = c.norm_topk_prob ? s[id] / (sum + S(1e-20)) : s[id];
      weight.push_back(v * S(c.routed_scaling_factor));
    }
  }
  return {ids, weight};
}

std::vector<RouterConfig> all_configs() {
  return {softmax_cfg(16, 8, 2, false),
          softmax_cfg(16, 8, 3, true),
          deepseek_cfg(16, 16, 4, 4, 2, true, 2.5),
          deepseek_cfg(16, 8, 2, 1, 1, false, 1.7),
          deepseek_v2_cfg(16, 16, 4, 4, 2, 2.5),
          deepseek_v2_cfg(16, 8, 3, 1, 1, 1.0),
          gpt_oss_cfg(16, 8, 3)};
}

std::string cfg_name(const RouterConfig& c) {
  return detail::str_of(router_kind_name(c.kind), " E", c.num_experts, " K", c.top_k,
                        c.norm_topk_prob ? " norm" : "", " groups ", c.n_group, "/", c.topk_group);
}

TEST(Router, MatchesPlainPerTokenReference) {
  for (DType dt : {DType::f64, DType::f32}) {
    for (const RouterConfig& cfg : all_configs()) {
      SCOPED_TRACE(cfg_name(cfg) + " " + std::string(dtype_name(dt)));
      Rng rng(7);
      Router router(cfg, dt);
      fill_params(router, rng);
      Tensor x_TD = random_tensor({37, cfg.hidden}, dt, rng);
      Routing r = router.forward(x_TD);
      ASSERT_EQ(r.T, 37);
      ASSERT_EQ(r.K, cfg.top_k);
      EXPECT_EQ(r.weights_TK.dtype(), dt);
      const double tol = dt == DType::f64 ? 1e-14 : 1e-6;
      for (int64_t t = 0; t < r.T; ++t) {
        auto [ids, weight] = dt == DType::f64 ? reference_route<double>(router, x_TD, t)
                                              : [&] {
                                                  auto [i, w] = reference_route<float>(router, x_TD, t);
                                                  return std::pair(i, std::vector<double>(w.begin(), w.end()));
                                                }();
        for (int64_t k = 0; k < r.K; ++k) {
          ASSERT_EQ(r.ids_TK[t * r.K + k], ids[k]) << "token " << t << " slot " << k;
          ASSERT_NEAR(r.weights_TK.get(t * r.K + k), weight[k], tol * std::abs(weight[k]) + tol)
              << "token " << t << " slot " << k;
        }
      }
    }
  }
}

TEST(Router, Bf16UpcastsAndKeepsFp32Logits) {
  // bf16 x and W are used exactly as their fp32 values: logits equal the f32 router's bitwise.
  for (const RouterConfig& cfg : all_configs()) {
    SCOPED_TRACE(cfg_name(cfg));
    Rng rng(3);
    Router r16(cfg, DType::bf16), r32(cfg, DType::f32);
    fill_params(r16, rng);
    for (const std::string& name : r16.param_names()) r32.param(name).copy_from(r16.param(name));
    Tensor x16 = random_tensor({9, cfg.hidden}, DType::bf16, rng);
    Routing a = r16.forward(x16), b = r32.forward(x16.to(DType::f32));
    EXPECT_EQ(a.logits_TE.dtype(), DType::f32);
    EXPECT_TRUE(testing::bitwise_equal(a.logits_TE, b.logits_TE, "logits_TE"));
    EXPECT_TRUE(testing::bitwise_equal(a.weights_TK, b.weights_TK, "weights_TK"));
    EXPECT_EQ(a.ids_TK, b.ids_TK);
    // Backward: the same fp32 products; dx is rounded to bf16 once, grads stay fp32.
    Tensor c_TK = random_tensor({9, cfg.top_k}, DType::f32, rng);
    Tensor dx16 = Tensor::empty({9, cfg.hidden}, DType::bf16);
    Tensor dx32 = Tensor::empty({9, cfg.hidden}, DType::f32);
    r16.backward(dx16, c_TK, x16, a);
    r32.backward(dx32, c_TK, x16.to(DType::f32), b);
    EXPECT_TRUE(testing::bitwise_equal(dx16, dx32.to(DType::bf16), "dx_TD"));
    EXPECT_EQ(r16.grad("weight").dtype(), DType::f32);
    EXPECT_TRUE(testing::bitwise_equal(r16.grad("weight"), r32.grad("weight"), "dweight"));
  }
}

// Finite differences of loss = sum(weights_TK * c_TK) for fixed random c, in f64.
TEST(Router, GradientsMatchFiniteDifferences) {
  for (const RouterConfig& cfg : all_configs()) {
    SCOPED_TRACE(cfg_name(cfg));
    Rng rng(11);
    Router router(cfg, DType::f64);
    fill_params(router, rng);
    Tensor x_TD = random_tensor({6, cfg.hidden}, DType::f64, rng);
    Tensor c_TK = random_tensor({6, cfg.top_k}, DType::f64, rng);
    const Routing base = router.forward(x_TD);
    auto loss = [&] {
      Routing r = router.forward(x_TD);
      // A flipped selection would make the difference quotient meaningless.
      EXPECT_EQ(r.ids_TK, base.ids_TK) << "a top-k choice flipped under the perturbation";
      double sum = 0;
      for (int64_t i = 0; i < c_TK.numel(); ++i) sum += r.weights_TK.get(i) * c_TK.get(i);
      return sum;
    };
    Tensor dx_TD = Tensor::empty({6, cfg.hidden}, DType::f64);
    router.zero_grad();
    router.backward(dx_TD, c_TK, x_TD, base);
    EXPECT_TRUE(fd_check(loss, x_TD, dx_TD, "dx_TD", 1e-6, 1e-9, 200));
    for (const std::string& name : router.param_names()) {
      if (!router.has_grad(name)) continue;
      EXPECT_TRUE(fd_check(loss, router.param(name), router.grad(name), name, 1e-6, 1e-9, 200));
    }
    // Gradients are not all zero (the check above would pass on a dead router).
    double norm = 0;
    for (int64_t i = 0; i < dx_TD.numel(); ++i) norm += std::abs(dx_TD.get(i));
    EXPECT_GT(norm, 1e-3);
  }
}

TEST(Router, BackwardAccumulates) {
  for (const RouterConfig& cfg : all_configs()) {
    SCOPED_TRACE(cfg_name(cfg));
    Rng rng(5);
    Router router(cfg, DType::f64);
    fill_params(router, rng);
    Tensor x_TD = random_tensor({5, cfg.hidden}, DType::f64, rng);
    Tensor c_TK = random_tensor({5, cfg.top_k}, DType::f64, rng);
    Routing r = router.forward(x_TD);
    Tensor once = Tensor::empty({5, cfg.hidden}, DType::f64);
    router.backward(once, c_TK, x_TD, r);
    Tensor dw_once = router.grad("weight").clone();
    Tensor twice = Tensor::zeros({5, cfg.hidden}, DType::f64);
    twice.fill(1.0);
    router.backward(twice, c_TK, x_TD, r, /*accumulate=*/true);
    Tensor want = Tensor::empty({5, cfg.hidden}, DType::f64);
    for (int64_t i = 0; i < want.numel(); ++i) want.set(i, once.get(i) + 1.0);
    EXPECT_TRUE(all_close(twice, want, 1e-15, 1e-15, "dx_TD accumulated"));
    Tensor dw_want = dw_once.clone();
    for (int64_t i = 0; i < dw_want.numel(); ++i) dw_want.set(i, 2 * dw_once.get(i));
    EXPECT_TRUE(all_close(router.grad("weight"), dw_want, 1e-15, 1e-15, "dweight accumulated"));
  }
}

TEST(Router, F32BackwardAgreesWithF64) {
  for (const RouterConfig& cfg : all_configs()) {
    SCOPED_TRACE(cfg_name(cfg));
    Rng rng(13);
    Router r64(cfg, DType::f64), r32(cfg, DType::f32);
    fill_params(r64, rng);
    for (const std::string& n : r64.param_names()) r32.param(n).copy_from(r64.param(n));
    Tensor x64 = random_tensor({8, cfg.hidden}, DType::f64, rng);
    Tensor c64 = random_tensor({8, cfg.top_k}, DType::f64, rng);
    Tensor x32 = x64.to(DType::f32), c32 = c64.to(DType::f32);
    Routing a = r64.forward(x64), b = r32.forward(x32);
    ASSERT_EQ(a.ids_TK, b.ids_TK);
    Tensor dx64 = Tensor::empty(x64.shape(), DType::f64), dx32 = Tensor::empty(x32.shape(), DType::f32);
    r64.backward(dx64, c64, x64, a);
    r32.backward(dx32, c32, x32, b);
    EXPECT_TRUE(all_close(dx32.to(DType::f64), dx64, 1e-4, 1e-6, "dx_TD"));
    EXPECT_TRUE(all_close(r32.grad("weight").to(DType::f64), r64.grad("weight"), 1e-4, 1e-6, "dweight"));
  }
}

// ---- Ties: exact equal scores choose the lower expert id, for every router.

TEST(Router, TiesBreakTowardLowerExpertId) {
  for (RouterConfig cfg : all_configs()) {
    SCOPED_TRACE(cfg_name(cfg));
    const int64_t E = cfg.num_experts, K = cfg.top_k, D = cfg.hidden;
    // All-zero parameters: every expert scores the same.
    Router zero(cfg, DType::f64);
    Rng rng(1);
    Tensor x_TD = random_tensor({3, D}, DType::f64, rng);
    Routing r = zero.forward(x_TD);
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t k = 0; k < K; ++k) EXPECT_EQ(r.ids_TK[t * K + k], k);
    }
    // Identical rows at the selection boundary: experts E-1, E-3 and 1 tie for
    // the last slots behind K-2 clear winners; lower ids win the tie. (Group limits
    // would drop some of them; group ties have their own test.)
    if (cfg.n_group > 1) continue;
    Router router(cfg, DType::f64);
    Tensor& w = router.param("weight");
    for (int64_t e = 0; e < E; ++e) w.set(e * D, -1.0);
    for (int64_t k = 0; k < K - 2; ++k) w.set((E / 2 + k) * D, 3.0 + double(k));
    for (int64_t e : {E - 1, E - 3, int64_t(1)}) w.set(e * D, 1.0);
    Tensor x1 = Tensor::zeros({1, D}, DType::f64);
    x1.set(0, 1.0);
    Routing tie = router.forward(x1);
    std::vector<int32_t> want;
    for (int64_t k = K - 3; k >= 0; --k) want.push_back(int32_t(E / 2 + k));
    want.push_back(1);
    want.push_back(int32_t(E - 3));
    EXPECT_EQ(tie.ids_TK, want);
    // The tied slots carry equal weights.
    EXPECT_EQ(tie.weights_TK.get(K - 2), tie.weights_TK.get(K - 1));
  }
}

TEST(Router, DeepSeekGroupTiesKeepLowerGroup) {
  // Four groups of two; groups 1 and 3 tie for the one kept group: group 1 wins.
  Router router(deepseek_cfg(1, 8, 2, 4, 1, true, 1.0), DType::f64);
  for (int64_t e = 0; e < 8; ++e) router.param("weight").set(e, (e / 2 == 1 || e / 2 == 3) ? 2.0 : 0.0);
  Routing r = router.forward(Tensor::from_values({1, 1}, DType::f64, {1.0}));
  EXPECT_EQ(r.ids_TK, (std::vector<int32_t>{2, 3}));
}

// ---- DeepSeek-V3 specifics. D = 1 and x = 1, so logit_e = weight[e].

Routing route_logits(Router& router, const std::vector<double>& logits) {
  for (size_t e = 0; e < logits.size(); ++e) router.param("weight").set(int64_t(e), logits[e]);
  return router.forward(Tensor::from_values({1, 1}, router.dtype(), {1.0}));
}

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

TEST(Router, DeepSeekDropsWholeGroups) {
  // Groups of two. Expert 6 has the best score, but its partner is hopeless, so
  // group 3 (sum of its top two) loses to groups 0 and 1.
  Router router(deepseek_cfg(1, 8, 3, 4, 2, false, 1.0), DType::f64);
  Routing r = route_logits(router, {1.5, 1.4, 1.3, 1.2, 0.0, 0.0, 5.0, -10.0});
  EXPECT_EQ(r.ids_TK, (std::vector<int32_t>{0, 1, 2}));
  // With all groups kept, expert 6 wins.
  Router all(deepseek_cfg(1, 8, 3, 4, 4, false, 1.0), DType::f64);
  Routing r_all = route_logits(all, {1.5, 1.4, 1.3, 1.2, 0.0, 0.0, 5.0, -10.0});
  EXPECT_EQ(r_all.ids_TK[0], 6);
}

TEST(Router, DeepSeekDroppedGroupsScoreZeroNotMinusInfinity) {
  // HF masks dropped groups with 0.0; kept experts whose biased score is negative
  // then lose to them. Group 0 is kept (-3.x > -5.x) but experts 2, 3 are chosen.
  Router router(deepseek_cfg(1, 4, 2, 2, 1, false, 1.0), DType::f64);
  Tensor& bias = router.param("e_score_correction_bias");
  for (int64_t e = 0; e < 4; ++e) bias.set(e, e < 2 ? -2.0 : -3.0);
  Routing r = route_logits(router, {0.0, 0.0, 0.0, 0.0});
  EXPECT_EQ(r.ids_TK, (std::vector<int32_t>{2, 3}));
}

TEST(Router, DeepSeekBiasSelectsButDoesNotWeigh) {
  const std::vector<double> logits{2.0, 1.0, 0.5, -1.0};
  for (bool norm : {false, true}) {
    SCOPED_TRACE(norm ? "norm" : "no norm");
    Router router(deepseek_cfg(1, 4, 2, 1, 1, norm, 2.5), DType::f64);
    Routing plain = route_logits(router, logits);
    EXPECT_EQ(plain.ids_TK, (std::vector<int32_t>{0, 1}));
    router.param("e_score_correction_bias").set(3, 1.0);  // lifts expert 3 past everyone
    Routing biased = route_logits(router, logits);
    EXPECT_EQ(biased.ids_TK, (std::vector<int32_t>{3, 0}));
    const double s3 = sigmoid(-1.0), s0 = sigmoid(2.0);
    const double denom = norm ? s3 + s0 + 1e-20 : 1.0;
    EXPECT_NEAR(biased.weights_TK.get(0), 2.5 * s3 / denom, 1e-15);
    EXPECT_NEAR(biased.weights_TK.get(1), 2.5 * s0 / denom, 1e-15);
    if (norm) {
      EXPECT_NEAR(biased.weights_TK.get(0) + biased.weights_TK.get(1), 2.5, 1e-15);
    }
    EXPECT_FALSE(router.has_grad("e_score_correction_bias"));
    EXPECT_THROW(router.grad("e_score_correction_bias"), Error);
  }
}

TEST(Router, DeepSeekV2KeepsGroupsByTheirBestExpert) {
  // Groups of two, one kept. Group 0 holds the best expert; group 1 the better
  // pair (V3's top-2 sum would keep it). V2 keeps group 0, so its weak expert 1
  // is chosen over both of group 1's.
  const std::vector<double> logits{3.0, -5.0, 2.0, 2.0};
  Router router(deepseek_v2_cfg(1, 4, 2, 2, 1, 16.0), DType::f64);
  Routing r = route_logits(router, logits);
  EXPECT_EQ(r.ids_TK, (std::vector<int32_t>{0, 1}));
  // Weights are the softmax over all E (not over the kept group), scaled.
  double sum = 0;
  for (double l : logits) sum += std::exp(l);
  EXPECT_NEAR(r.weights_TK.get(0), 16.0 * std::exp(3.0) / sum, 1e-14);
  EXPECT_NEAR(r.weights_TK.get(1), 16.0 * std::exp(-5.0) / sum, 1e-14);
  // Greedy (one group): the two best of all.
  Router greedy(deepseek_v2_cfg(1, 4, 2, 1, 1, 16.0), DType::f64);
  EXPECT_EQ(route_logits(greedy, logits).ids_TK, (std::vector<int32_t>{0, 2}));
  // It never renormalises, and groups of one expert are fine.
  RouterConfig norm = deepseek_v2_cfg(1, 4, 2, 1, 1, 1.0);
  norm.norm_topk_prob = true;
  EXPECT_THROW(norm.validate(), Error);
  EXPECT_NO_THROW(deepseek_v2_cfg(1, 4, 2, 4, 2, 1.0).validate());
}

TEST(Router, DeepSeekSelectionBiasUpdateFollowsImbalance) {
  Router router(deepseek_cfg(4, 4, 1, 1, 1, true, 1.0), DType::f64);
  Tensor& bias = router.param("e_score_correction_bias");
  bias.set(2, 0.5);
  router.update_selection_bias({10, 0, 5, 5}, 0.001);  // mean 5
  EXPECT_DOUBLE_EQ(bias.get(0), -0.001);  // overloaded: less likely next time
  EXPECT_DOUBLE_EQ(bias.get(1), 0.001);   // idle: more likely
  EXPECT_DOUBLE_EQ(bias.get(2), 0.5);     // balanced: unchanged
  EXPECT_DOUBLE_EQ(bias.get(3), 0.0);
  EXPECT_THROW(router.update_selection_bias({1, 2}, 0.001), Error);
  Router softmax(softmax_cfg(4, 4, 1, false), DType::f64);
  EXPECT_THROW(softmax.update_selection_bias({1, 1, 1, 1}, 0.001), Error);
}

TEST(Router, DeepSeekBiasUpdateBalancesLoad) {
  // Repeated updates from the router's own counts pull a skewed router toward balance.
  Rng rng(21);
  Router router(deepseek_cfg(8, 8, 2, 1, 1, true, 1.0), DType::f32);
  fill_params(router, rng);
  // Feature 0 is always 1 and only expert 0 reads it: expert 0 wins nearly every token.
  Tensor x_TD = random_tensor({256, 8}, DType::f32, rng);
  for (int64_t t = 0; t < 256; ++t) x_TD.set(t * 8, 1.0);
  for (int64_t e = 0; e < 8; ++e) router.param("weight").set(e * 8, e == 0 ? 4.0 : 0.0);
  auto spread = [&] {
    std::vector<int64_t> c = expert_counts(router.forward(x_TD), 8);
    return *std::max_element(c.begin(), c.end()) - *std::min_element(c.begin(), c.end());
  };
  const int64_t before = spread();
  for (int step = 0; step < 60; ++step) {
    router.update_selection_bias(expert_counts(router.forward(x_TD), 8), 0.03);
  }
  EXPECT_LT(spread(), before / 2);
}

TEST(Router, RoutedScalingFactorScalesWeights) {
  Rng rng(2);
  Router one(deepseek_cfg(8, 8, 2, 2, 1, false, 1.0), DType::f64);
  Router scaled(deepseek_cfg(8, 8, 2, 2, 1, false, 2.5), DType::f64);
  fill_params(one, rng);
  for (const std::string& n : one.param_names()) scaled.param(n).copy_from(one.param(n));
  Tensor x_TD = random_tensor({4, 8}, DType::f64, rng);
  Routing a = one.forward(x_TD), b = scaled.forward(x_TD);
  EXPECT_EQ(a.ids_TK, b.ids_TK);
  for (int64_t i = 0; i < a.weights_TK.numel(); ++i) {
    EXPECT_DOUBLE_EQ(b.weights_TK.get(i), 2.5 * a.weights_TK.get(i));
  }
}

// ---- Other router specifics.

TEST(Router, SoftmaxNormalisesOnlyWhenAsked) {
  Rng rng(4);
  for (bool norm : {false, true}) {
    Router router(softmax_cfg(8, 8, 3, norm), DType::f64);
    fill_params(router, rng);
    Routing r = router.forward(random_tensor({5, 8}, DType::f64, rng));
    for (int64_t t = 0; t < 5; ++t) {
      double sum = 0;
      for (int64_t k = 0; k < 3; ++k) sum += r.weights_TK.get(t * 3 + k);
      if (norm) {
        EXPECT_NEAR(sum, 1.0, 1e-15);
      } else {
        EXPECT_LT(sum, 1.0 - 1e-6);
      }
    }
  }
}

TEST(Router, GptOssBiasChangesSelection) {
  Router router(gpt_oss_cfg(1, 4, 1), DType::f64);
  Routing a = route_logits(router, {1.0, 0.5, 0.0, 0.0});
  EXPECT_EQ(a.ids_TK[0], 0);
  EXPECT_DOUBLE_EQ(a.weights_TK.get(0), 1.0);  // softmax over one chosen logit
  router.param("bias").set(2, 2.0);
  Routing b = router.forward(Tensor::from_values({1, 1}, DType::f64, {1.0}));
  EXPECT_EQ(b.ids_TK[0], 2);
}

TEST(Router, RejectsNonFiniteLogitsAndBadInputs) {
  Router router(softmax_cfg(4, 4, 2, false), DType::f64);
  Tensor x = Tensor::zeros({2, 4}, DType::f64);
  x.set(5, NAN);
  router.param("weight").fill(1.0);
  EXPECT_THROW(router.forward(x), Error);
  EXPECT_THROW(router.forward(Tensor::zeros({2, 5}, DType::f64)), Error);
  EXPECT_THROW(router.forward(Tensor::zeros({2, 4}, DType::f32)), Error);
  EXPECT_THROW(router.param("bias"), Error);
}

// ---- Configuration errors name the problem.

void expect_config_error(const RouterConfig& cfg, const std::string& needle) {
  try {
    cfg.validate("model.layers.3.mlp.gate");
    ADD_FAILURE() << "no error for " << cfg_name(cfg) << " (wanted '" << needle << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(e.where(), "model.layers.3.mlp.gate");
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST(Router, BadConfigurationsAreClearErrors) {
  expect_config_error(softmax_cfg(8, 4, 5, false), "top_k K = 5");
  expect_config_error(softmax_cfg(8, 4, 0, false), "top_k K = 0");
  expect_config_error(softmax_cfg(0, 4, 1, false), "hidden size");
  expect_config_error(softmax_cfg(8, 0, 1, false), "num_experts");
  expect_config_error(deepseek_cfg(8, 12, 2, 5, 1, true, 1.0), "does not divide");
  expect_config_error(deepseek_cfg(8, 16, 2, 4, 5, true, 1.0), "topk_group = 5");
  expect_config_error(deepseek_cfg(8, 16, 5, 4, 1, true, 1.0), "exceeds the 4 experts");
  expect_config_error(deepseek_cfg(8, 8, 1, 8, 1, true, 1.0), "groups of 1");
  expect_config_error(deepseek_cfg(8, 8, 1, 2, 1, true, 0.0), "routed_scaling_factor");
  RouterConfig grouped_softmax = softmax_cfg(8, 8, 2, false);
  grouped_softmax.n_group = 2;
  expect_config_error(grouped_softmax, "n_group = 2");
  EXPECT_THROW(Router(softmax_cfg(8, 4, 5, false), DType::f32), Error);
}

}  // namespace
}  // namespace tiermoe
