// The expert graphs on a GPU against the host's expert math (graph_cases.h
// states and argues the tolerances): every kind x dtype x absorbed or not x
// bias x activation, at a small and a tensor-core-sized shape; the check
// failing on a doubled score and on dirty padding; the weight-gradient sums
// continued launch by launch; one capture per key. Each test skips, saying
// why, without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "gpu.h"
#include "graph_cases.h"

namespace tiermoe {
namespace {

using testing::GraphCase;

testing::GraphRunner on(Device& dev) { return testing::device_runner(dev); }

class CudaGraphParity : public ::testing::TestWithParam<GraphCase> {};

TEST_P(CudaGraphParity, GpuEqualsTheHostWithinTolerance) {
  TIERMOE_REQUIRE_GPU();
  const GraphCase c = GetParam();
  MemoryTracker tracker;
  auto dev = testing::gpu(size_t(256) << 20, &tracker);
  // Small and odd-sized (11 of 16 rows), then tensor-core sized (100 of 128).
  for (const auto& [D, F, G, M] : {std::tuple{32, 48, 16, 11}, std::tuple{256, 192, 128, 100}}) {
    SCOPED_TRACE(detail::str_of("D ", D, " F ", F, " G ", G, " M ", M));
    const auto p = testing::make_graph_problem(c, D, F, G, M, 17);
    EXPECT_TRUE(testing::graphs_match(testing::run_graphs(p.in, on(*dev)), p.want, c));
  }
  EXPECT_EQ(dev->used(), 0u);
  EXPECT_EQ(tracker.live(MemTag::device), 0u);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaGraphParity, ::testing::ValuesIn(testing::all_graph_cases()),
                         testing::graph_case_name);

TEST(CudaGraphCheck, FailsOnADoubledScoreAndOnDirtyPadding) {
  TIERMOE_REQUIRE_GPU();
  auto dev = testing::gpu(size_t(64) << 20);
  using testing::Spoil;
  for (DType t : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const GraphCase absorbed{t, true, true}, post{t, false, true};
    const auto doubled =
        testing::make_graph_problem(absorbed, 32, 48, 16, 11, 17, Spoil::double_one_score);
    EXPECT_FALSE(
        testing::graphs_match(testing::run_graphs(doubled.in, on(*dev)), doubled.want, absorbed));
    const auto dirty =
        testing::make_graph_problem(post, 32, 48, 16, 11, 17, Spoil::dirty_dy_padding);
    EXPECT_FALSE(testing::graphs_match(testing::run_graphs(dirty.in, on(*dev)), dirty.want, post));
    const auto kept_out =
        testing::make_graph_problem(absorbed, 32, 48, 16, 11, 17, Spoil::dirty_dy_padding);
    EXPECT_TRUE(
        testing::graphs_match(testing::run_graphs(kept_out.in, on(*dev)), kept_out.want, absorbed));
  }
}

// M = 40 rows of one expert as three launches of G = 16 (sums started, then
// continued twice) equal the host summing in blocks of 16.
TEST(CudaGraphs, ContinuedSumsEqualTheHostsBlockedSum) {
  TIERMOE_REQUIRE_GPU();
  constexpr int64_t D = 32, F = 48, G = 16, M = 40;
  auto dev = testing::gpu(size_t(64) << 20);
  for (const GraphCase c : {GraphCase{DType::f64, true, true}, GraphCase{DType::f32, false, true},
                            GraphCase{DType::bf16, true, true}}) {
    SCOPED_TRACE(dtype_name(c.dtype));
    ExpertsConfig cfg = testing::graph_experts_config(c, D, F);
    cfg.dw_row_block = G;
    GroupedExperts ex(cfg, c.dtype);
    Rng rng(3);
    testing::fill_experts(ex, rng, 0.3);
    const DType t = c.dtype, s = testing::score_dtype_of(t);
    const Tensor x = testing::random_tensor({M, D}, t, rng),
                 dy = testing::random_tensor({M, D}, t, rng);
    Tensor score;
    if (c.absorb) {
      score = Tensor::empty({M}, s);
      fill_uniform(score, rng, 0.1, 1.0);
    }
    ExpertRowsActs acts;
    acts.h_M2F = Tensor::zeros({M, 2 * F}, t), acts.a_MF = Tensor::zeros({M, F}, t);
    acts.x_MD = x;
    Tensor y = Tensor::zeros({M, D}, t), dx = Tensor::zeros({M, D}, t), dscore;
    if (c.absorb) dscore = Tensor::zeros({M}, s);
    ex.forward_rows(0, y, acts, x, score);
    ex.allocate_grads();
    ex.zero_grad();
    ex.backward_rows(0, dx, dscore, dy, acts, score, /*weight_grads=*/true);

    const ExpertWeights w = ex.weights(0);
    Tensor dw13 = Tensor::zeros({2 * F, D}, s), dw2 = Tensor::zeros({D, F}, s);
    Tensor db13 = Tensor::zeros({2 * F}, s), db2 = Tensor::zeros({D}, s);
    const double tol = testing::graph_tolerance(t);
    for (int64_t i = 0; i * G < M; ++i) {
      const int64_t b = i * G, e = std::min(M, b + G);
      testing::GraphSlots slots = {{"dy_GD", testing::padded(dy.rows(b, e), G)},
                                   {"h_G2F", testing::padded(acts.h_M2F.rows(b, e), G)},
                                   {"x_GD", testing::padded(x.rows(b, e), G)},
                                   {"a_GF", testing::padded(acts.a_MF.rows(b, e), G)},
                                   {"w13_FD", w.w13_FD},
                                   {"w2_DF", w.w2_DF},
                                   {"dx_GD", Tensor::zeros({G, D}, t)},
                                   {"dw13_FD", dw13},
                                   {"dw2_DF", dw2}};
      if (c.absorb) {
        slots.emplace_back("score_G", testing::padded(score.rows(b, e), G));
        slots.emplace_back("dscore_G", Tensor::zeros({G}, s));
      }
      if (c.bias) {
        slots.emplace_back("b13_F", w.b13_F);
        slots.emplace_back("b2_D", w.b2_D);
        slots.emplace_back("db13_F", db13);
        slots.emplace_back("db2_D", db2);
      }
      on (*dev)(testing::graph_key(GraphKind::expert_bwd_dx_dw, c, D, F, G), slots, i > 0);
      EXPECT_TRUE(testing::close_rows(testing::slot_of(slots, "dx_GD"), dx.rows(b, e), tol, "dx"));
      if (c.absorb) {
        EXPECT_TRUE(testing::close_rows(testing::slot_of(slots, "dscore_G"), dscore.rows(b, e), tol,
                                        "dscore"));
      }
    }
    const ExpertGrads g = ex.grads(0);
    EXPECT_TRUE(testing::close(dw13, g.dw13_FD, tol, "dw13"));
    EXPECT_TRUE(testing::close(dw2, g.dw2_DF, tol, "dw2"));
    if (c.bias) {
      EXPECT_TRUE(testing::close(db13, g.db13_F, tol, "db13"));
      EXPECT_TRUE(testing::close(db2, g.db2_D, tol, "db2"));
    }
  }
}

TEST(CudaGraphs, EachKeyIsCapturedOnce) {
  TIERMOE_REQUIRE_GPU();
  auto dev = testing::gpu(size_t(16) << 20);
  const GraphCase c{DType::bf16, true, false};
  const GraphKey a = testing::graph_key(GraphKind::expert_fwd, c, 64, 32, 16);
  GraphKey b = a;
  b.G = 24;
  const Graph& ga = dev->compile(a);
  EXPECT_EQ(&dev->compile(a), &ga);
  EXPECT_NE(&dev->compile(b), &ga);
  EXPECT_EQ(ga.key(), a);
}

}  // namespace
}  // namespace tiermoe
