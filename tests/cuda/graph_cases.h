#pragma once
// One expert's three graphs (expert_fwd, expert_bwd_dx, expert_bwd_dx_dw)
// over G rows, of which M are real and the rest zero padding with score 0,
// against the host's expert math (GroupedExperts on the ref kernels, which
// run on any CPU) over the M rows. Shared by the plan's host interpreter
// (test_expert_plan.cpp) and the GPU (test_cuda_graphs.cpp): a runner takes
// the inputs and returns the G-row outputs and the gradient sums.
//
// Tolerances, as norm-wise relative errors |got - want| / |want| per tensor:
//  f64  1e-12: both sides sum in f64; only the order differs.
//  f32  1e-5:  the bound; the GPU's f32 GEMMs sum in another order
//              (about sqrt(K) * 6e-8 relative, K <= 2F here) with no TF32.
//  bf16 1e-2:  every stored value is rounded to bf16 (a relative step of
//              2^-8 = 3.9e-3). Both sides compute the same formulas with f32
//              sums in different orders, so a value differs only where the
//              two f32 results straddle a rounding boundary, and then by one
//              bf16 step; a chain of at most four such roundings (h, a, a',
//              y; dy, da, dh, dx) keeps the norm-wise error near one step.
//              1e-2 is 2.5 steps: loose enough for that, while a doubled
//              score on one row of 11 or junk in the padding gives 10% and
//              more (the spoiled cases below must fail it).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/testing.h"
#include "moe/moe_test_util.h"
#include "tiermoe/moe/expert_math.h"
#include "tiermoe/tier/device.h"

namespace tiermoe::testing {

inline double graph_tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-12;
    case DType::f32:
      return 1e-5;
    case DType::bf16:
      return 1e-2;
  }
  return 0;
}

inline DType score_dtype_of(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

struct GraphCase {
  DType dtype = DType::f32;
  bool absorb = true, bias = false;
  ExpertActivation activation = ExpertActivation::swiglu;
};

inline std::string graph_case_name(const ::testing::TestParamInfo<GraphCase>& info) {
  const GraphCase& c = info.param;
  return detail::str_of(dtype_name(c.dtype), c.absorb ? "_absorb" : "_post", c.bias ? "_bias" : "",
                        "_", expert_activation_name(c.activation));
}

// Every kind is run for each case: every dtype x absorbed or not x bias or
// not, with SwiGLU, and GPT-OSS (always with biases) in every dtype.
inline std::vector<GraphCase> all_graph_cases() {
  std::vector<GraphCase> cases;
  for (DType t : {DType::f64, DType::f32, DType::bf16}) {
    for (bool absorb : {true, false}) {
      for (bool bias : {false, true}) cases.push_back({t, absorb, bias});
      cases.push_back({t, absorb, true, ExpertActivation::gpt_oss});
    }
  }
  return cases;
}

// GPT-OSS's clamp with a small limit, so that it is exercised.
constexpr GptOssActivation kGraphGptOss{.alpha = 1.702, .limit = 1.5};

inline GraphKey graph_key(GraphKind kind, const GraphCase& c, int64_t D, int64_t F, int64_t G) {
  return GraphKey{
      .kind = kind,
      .D = D,
      .F = F,
      .G = G,
      .dtype = c.dtype,
      .activation = c.activation,
      .absorb = c.absorb,
      .bias = c.bias,
      .gpt_oss = c.activation == ExpertActivation::gpt_oss ? kGraphGptOss : GptOssActivation{}};
}

inline ExpertsConfig graph_experts_config(const GraphCase& c, int64_t D, int64_t F) {
  ExpertsConfig cfg;
  cfg.num_experts = 1, cfg.hidden = D, cfg.ffn = F;
  cfg.activation = c.activation;
  cfg.gpt_oss = kGraphGptOss;
  cfg.bias = c.bias;
  cfg.kernels = KernelSet::ref;
  return cfg;
}

// What the graphs read: the expert's weights and G rows of x, score and dy
// (zero padding past M; score 0 there).
struct GraphInputs {
  GraphCase c;
  int64_t D = 0, F = 0, G = 0, M = 0;
  Tensor w13, w2, b13, b2;  // b13, b2: bias only
  Tensor x, score, dy;      // G rows; score: absorbed only
};

// What they give: G rows of each output and the sums (the grad dtype).
struct GraphOutputs {
  Tensor y, h, a, dx_only, dscore_only, dx, dscore;
  Tensor dw13, dw2, db13, db2;
};

// The host's results over the M real rows (sums started from zero).
struct HostReference {
  Tensor y, h, a, dx_only, dscore_only, dx, dscore;
  ExpertGrads grads;
};

// What a test spoils on purpose in the graphs' inputs (the host keeps them clean).
enum class Spoil { nothing, double_one_score, dirty_dy_padding };

inline Tensor padded(const Tensor& rows_M, int64_t G) {
  Shape s = rows_M.shape();
  s[0] = G;
  Tensor t = Tensor::zeros(s, rows_M.dtype());
  Tensor head = t.rows(0, rows_M.size(0));
  head.copy_from(rows_M);
  return t;
}

// One expert with random weights, M real rows, the host's results, and the
// G-row inputs (spoiled as asked).
struct GraphProblem {
  GraphInputs in;
  HostReference want;
};

inline GraphProblem make_graph_problem(const GraphCase& c, int64_t D, int64_t F, int64_t G,
                                       int64_t M, uint64_t seed, Spoil spoil = Spoil::nothing) {
  Rng rng(seed);
  GroupedExperts ex(graph_experts_config(c, D, F), c.dtype);
  fill_experts(ex, rng, 0.3);
  const DType t = c.dtype, s = score_dtype_of(t);
  Tensor x = random_tensor({M, D}, t, rng), dy = random_tensor({M, D}, t, rng), score;
  if (c.absorb) {
    score = Tensor::empty({M}, s);
    fill_uniform(score, rng, 0.1, 1.0);
  }
  GraphProblem p;
  HostReference& r = p.want;
  r.y = Tensor::zeros({M, D}, t), r.h = Tensor::zeros({M, 2 * F}, t),
  r.a = Tensor::zeros({M, F}, t);
  ExpertRowsActs acts;
  acts.h_M2F = r.h, acts.a_MF = r.a;
  ex.forward_rows(0, r.y, acts, x, score);
  r.dx_only = Tensor::zeros({M, D}, t);
  if (c.absorb) r.dscore_only = Tensor::zeros({M}, s);
  ex.backward_rows(0, r.dx_only, r.dscore_only, dy, acts, score, /*weight_grads=*/false);
  ex.allocate_grads();
  ex.zero_grad();
  acts.x_MD = x;
  r.dx = Tensor::zeros({M, D}, t);
  if (c.absorb) r.dscore = Tensor::zeros({M}, s);
  ex.backward_rows(0, r.dx, r.dscore, dy, acts, score, /*weight_grads=*/true);
  const ExpertGrads g = ex.grads(0);
  r.grads.dw13_FD = g.dw13_FD.clone(), r.grads.dw2_DF = g.dw2_DF.clone();
  if (c.bias) r.grads.db13_F = g.db13_F.clone(), r.grads.db2_D = g.db2_D.clone();

  GraphInputs& in = p.in;
  in.c = c, in.D = D, in.F = F, in.G = G, in.M = M;
  const ExpertWeights w = ex.weights(0);
  in.w13 = w.w13_FD.clone(), in.w2 = w.w2_DF.clone();
  if (c.bias) in.b13 = w.b13_F.clone(), in.b2 = w.b2_D.clone();
  in.x = padded(x, G), in.dy = padded(dy, G);
  if (c.absorb) in.score = padded(score, G);
  if (spoil == Spoil::double_one_score) in.score.set(M / 2, 2 * in.score.get(M / 2));
  if (spoil == Spoil::dirty_dy_padding) {
    Tensor pad = in.dy.rows(M, G);
    pad.copy_from(random_tensor({G - M, D}, t, rng));
  }
  return p;
}

inline double rel_error(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    num += (g - w) * (g - w);
    den += w * w;
  }
  if (std::isnan(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline ::testing::AssertionResult close(const Tensor& got, const Tensor& want, double tol,
                                        const std::string& name) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << name << ": " << got.str() << " vs " << want.str();
  }
  const double e = rel_error(got, want);
  if (e <= tol) return ::testing::AssertionSuccess() << name << ": " << e;
  return ::testing::AssertionFailure() << name << ": relative error " << e << " > " << tol;
}

// The first M rows of a G-row output against the host's M rows.
inline ::testing::AssertionResult close_rows(const Tensor& got_G, const Tensor& want_M, double tol,
                                             const std::string& name) {
  return close(got_G.rows(0, want_M.size(0)), want_M, tol, name);
}

// Every output and sum against the host; the first failure, else success.
inline ::testing::AssertionResult graphs_match(const GraphOutputs& d, const HostReference& h,
                                               const GraphCase& c) {
  const double tol = graph_tolerance(c.dtype);
  std::vector<::testing::AssertionResult> all = {
      close_rows(d.y, h.y, tol, "y"),
      close_rows(d.h, h.h, tol, "h"),
      close_rows(d.a, h.a, tol, "a"),
      close_rows(d.dx_only, h.dx_only, tol, "dx (expert_bwd_dx)"),
      close_rows(d.dx, h.dx, tol, "dx (expert_bwd_dx_dw)"),
      close(d.dw13, h.grads.dw13_FD, tol, "dw13"),
      close(d.dw2, h.grads.dw2_DF, tol, "dw2")};
  if (c.absorb) {
    all.push_back(close_rows(d.dscore_only, h.dscore_only, tol, "dscore (expert_bwd_dx)"));
    all.push_back(close_rows(d.dscore, h.dscore, tol, "dscore (expert_bwd_dx_dw)"));
  }
  if (c.bias) {
    all.push_back(close(d.db13, h.grads.db13_F, tol, "db13"));
    all.push_back(close(d.db2, h.grads.db2_D, tol, "db2"));
  }
  for (auto& r : all) {
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tiermoe::testing

namespace tiermoe::testing {

// Runs one graph of `key` over host tensors named as its slots: inputs
// filled, outputs and sums given (sums hold what a continued launch adds
// to); the runner writes every output back into its tensor.
using GraphSlots = std::vector<std::pair<std::string, Tensor>>;
using GraphRunner = std::function<void(const GraphKey& key, GraphSlots& slots, bool sum_started)>;

inline Tensor slot_of(const GraphSlots& slots, const std::string& name) {
  for (const auto& [n, t] : slots) {
    if (n == name) return t;
  }
  return Tensor();
}

// The three graphs chained as a device runs them (the backward graphs read
// the forward's h and a); the started sums begin as junk, which a started
// sum must overwrite.
inline GraphOutputs run_graphs(const GraphInputs& in, const GraphRunner& run, uint64_t seed = 5) {
  const GraphCase& c = in.c;
  const int64_t D = in.D, F = in.F, G = in.G;
  const DType t = c.dtype, s = score_dtype_of(t);
  Rng rng(seed);
  GraphOutputs out;
  auto weights = [&](GraphSlots& v) {
    v.emplace_back("w13_FD", in.w13);
    v.emplace_back("w2_DF", in.w2);
    if (c.bias) {
      v.emplace_back("b13_F", in.b13);
      v.emplace_back("b2_D", in.b2);
    }
    if (c.absorb) v.emplace_back("score_G", in.score);
  };
  out.y = Tensor::zeros({G, D}, t), out.h = Tensor::zeros({G, 2 * F}, t);
  out.a = Tensor::zeros({G, F}, t);
  GraphSlots fwd = {{"x_GD", in.x}, {"y_GD", out.y}, {"h_G2F", out.h}, {"a_GF", out.a}};
  weights(fwd);
  run(graph_key(GraphKind::expert_fwd, c, D, F, G), fwd, false);

  out.dx_only = Tensor::zeros({G, D}, t);
  GraphSlots bdx = {{"dy_GD", in.dy}, {"h_G2F", out.h}, {"dx_GD", out.dx_only}};
  weights(bdx);
  if (c.absorb) {
    out.dscore_only = Tensor::zeros({G}, s);
    bdx.emplace_back("a_GF", out.a);
    bdx.emplace_back("dscore_G", out.dscore_only);
  }
  run(graph_key(GraphKind::expert_bwd_dx, c, D, F, G), bdx, false);

  out.dx = Tensor::zeros({G, D}, t);
  out.dw13 = random_tensor({2 * F, D}, s, rng), out.dw2 = random_tensor({D, F}, s, rng);
  GraphSlots bdw = {{"dy_GD", in.dy},  {"h_G2F", out.h},      {"x_GD", in.x},     {"a_GF", out.a},
                    {"dx_GD", out.dx}, {"dw13_FD", out.dw13}, {"dw2_DF", out.dw2}};
  weights(bdw);
  if (c.absorb) {
    out.dscore = Tensor::zeros({G}, s);
    bdw.emplace_back("dscore_G", out.dscore);
  }
  if (c.bias) {
    out.db13 = random_tensor({2 * F}, s, rng), out.db2 = random_tensor({D}, s, rng);
    bdw.emplace_back("db13_F", out.db13);
    bdw.emplace_back("db2_D", out.db2);
  }
  run(graph_key(GraphKind::expert_bwd_dx_dw, c, D, F, G), bdw, false);
  return out;
}

}  // namespace tiermoe::testing
