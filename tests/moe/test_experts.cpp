// GroupedExperts through HostExperts: every backward against f64 finite
// differences, per expert variant, with and without absorbed scores.
#include "moe/moe_test_util.h"
#include "tiermoe/moe/dispatch.h"
#include "tiermoe/moe/executor.h"

namespace tiermoe {
namespace {

using testing::Variant;

struct ExpertCase {
  Variant variant;
  bool absorbed;
};

class ExpertsGrad : public ::testing::TestWithParam<ExpertCase> {};

TEST_P(ExpertsGrad, BackwardMatchesFiniteDifferences) {
  const auto [variant, absorbed] = GetParam();
  const int64_t T = 6, K = 2, E = 3, D = 5, F = 4;
  Rng rng(21);
  GroupedExperts ex(testing::experts_config(variant, E, D, F), DType::f64);
  testing::fill_experts(ex, rng);
  HostExperts host(ex);
  Routing r = testing::fixed_routing(T, K, E, DType::f64, rng);
  // Padded rows (score 0, zero input) must contribute nothing to any gradient.
  DispatchPlan plan = PaddedDispatcher::to_multiple(4).plan(r.ids_TK, r.weights_TK, E);
  const int64_t N = plan.N;
  Tensor x_ND = testing::random_tensor({N, D}, DType::f64, rng);
  for (int64_t n = 0; n < N; ++n) {
    if (plan.token_N[size_t(n)] < 0) x_ND.rows(n, n + 1).zero();
  }
  Tensor P = testing::random_tensor({N, D}, DType::f64, rng);
  Tensor score_N = absorbed ? plan.score_N : Tensor();

  auto loss = [&]() {
    Tensor y = Tensor::empty({N, D}, DType::f64);
    SavedTensors saved("experts");
    host.forward(y, x_ND, plan.offset_E, score_N, saved, ExpertSaves{.x = false});
    return testing::projected_loss(y, P);
  };
  Tensor y = Tensor::empty({N, D}, DType::f64);
  SavedTensors saved("experts");
  host.forward(y, x_ND, plan.offset_E, score_N, saved, ExpertSaves{});
  EXPECT_TRUE(saved.has("x_ND") && saved.has("h_N2F") && saved.has("a_NF"));
  ex.zero_grad();
  Tensor dx = Tensor::empty({N, D}, DType::f64), ds = Tensor::zeros({N}, DType::f64);
  host.backward(dx, ds, P, plan.offset_E, score_N, saved, /*weight_grads=*/true,
                /*adapter_grads=*/false);

  EXPECT_TRUE(testing::fd_check(loss, x_ND, dx, "dx_ND"));
  for (const auto& name : ex.param_names()) {
    EXPECT_TRUE(testing::fd_check(loss, ex.param(name), ex.grad(name), "d" + name, 1e-6, 1e-8, 48));
  }
  if (absorbed) {
    EXPECT_TRUE(testing::fd_check(loss, plan.score_N, ds, "dscore_N"));
  }

  // dx alone (frozen experts) gives the same dx and leaves the grads alone.
  ex.zero_grad();
  SavedTensors lean("experts");
  host.forward(y, x_ND, plan.offset_E, score_N, lean, ExpertSaves{.x = false});
  EXPECT_FALSE(lean.has("x_ND"));
  Tensor dx2 = Tensor::empty({N, D}, DType::f64), ds2 = Tensor::zeros({N}, DType::f64);
  host.backward(dx2, ds2, P, plan.offset_E, score_N, lean, /*weight_grads=*/false,
                /*adapter_grads=*/false);
  EXPECT_TRUE(testing::bitwise_equal(dx2, dx, "dx (dx only)"));
  if (absorbed) {
    EXPECT_TRUE(testing::bitwise_equal(ds2, ds, "dscore (dx only)"));
  }
  for (const auto& name : ex.param_names()) EXPECT_EQ(testing::max_abs(ex.grad(name)), 0.0) << name;
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ExpertsGrad,
    ::testing::Values(ExpertCase{Variant::swiglu, false}, ExpertCase{Variant::swiglu, true},
                      ExpertCase{Variant::gpt_oss_bias, false},
                      ExpertCase{Variant::gpt_oss_bias, true},
                      ExpertCase{Variant::post_norm, false}),
    [](const auto& info) {
      return std::string(testing::variant_name(info.param.variant)) +
             (info.param.absorbed ? "_absorbed" : "_plain");
    });

TEST(ExpertOps, GptOssActivationClampsAndInterleaves) {
  // Row: (gate, up) pairs; limit 7, alpha 1.702.
  Tensor h = Tensor::from_values({1, 6}, DType::f64, {1.0, 2.0, 9.0, -9.0, -3.0, 8.0});
  Tensor a = Tensor::empty({1, 3}, DType::f64);
  gpt_oss_glu_forward(a, h, GptOssActivation{});
  auto glu = [](double g) { return g / (1 + std::exp(-1.702 * g)); };
  EXPECT_NEAR(a.get(0), (2.0 + 1) * glu(1.0), 1e-15);
  EXPECT_NEAR(a.get(1), (-7.0 + 1) * glu(7.0), 1e-15);  // gate clamped to 7, up to -7
  EXPECT_NEAR(a.get(2), (7.0 + 1) * glu(-3.0), 1e-15);  // gate has no lower clamp
  Tensor da = Tensor::from_values({1, 3}, DType::f64, {1, 1, 1}), dh = Tensor::empty({1, 6}, DType::f64);
  gpt_oss_glu_backward(dh, da, h, GptOssActivation{});
  EXPECT_EQ(dh.get(2), 0.0);  // clamped gate
  EXPECT_EQ(dh.get(3), 0.0);  // clamped up
  EXPECT_EQ(dh.get(5), 0.0);
  EXPECT_NE(dh.get(4), 0.0);
}

TEST(ExpertOps, AbsorbedScalingRoundsOnceThroughFp32) {
  Rng rng(5);
  Tensor a = testing::random_tensor({3, 7}, DType::bf16, rng);
  Tensor s = Tensor::from_values({3}, DType::f32, {0.3f, 0.7f, 0.0f});
  Tensor out = Tensor::empty({3, 7}, DType::bf16);
  scale_rows_forward(out, a, s);
  for (int64_t i = 0; i < a.numel(); ++i) {
    float want = bf16_to_float(float_to_bf16(float(a.get(i)) * float(s.get(i / 7))));
    EXPECT_EQ(out.get(i), double(want));
  }
}

TEST(Experts, BadConfigurationIsAClearError) {
  ExpertsConfig c = testing::experts_config(Variant::swiglu, 0, 4, 4);
  EXPECT_THROW(GroupedExperts(c, DType::f32), Error);
  GroupedExperts ok(testing::experts_config(Variant::swiglu, 2, 4, 4), DType::f32);
  EXPECT_THROW(ok.param("b13"), Error);
  GroupedExperts normed(testing::experts_config(Variant::post_norm, 2, 4, 4), DType::f32);
  HostExperts host(normed);
  Tensor x = Tensor::zeros({2, 4}, DType::f32), y = Tensor::empty({2, 4}, DType::f32);
  SavedTensors saved;
  EXPECT_THROW(host.forward(y, x, {0, 1, 2}, Tensor::zeros({2}, DType::f32), saved, {}), Error);
  EXPECT_THROW(host.forward(y, x, {0, 1}, Tensor(), saved, {}), Error);  // offsets vs E
}

}  // namespace
}  // namespace tiermoe
