// Dispatch plans, permute/combine and their backwards.
#include <memory>

#include "moe/moe_test_util.h"
#include "tiermoe/moe/dispatch.h"

namespace tiermoe {
namespace {

using testing::fixed_routing;

std::vector<std::shared_ptr<Dispatcher>> all_dispatchers() {
  return {std::make_shared<LocalDispatcher>(),
          std::make_shared<PaddedDispatcher>(PaddedDispatcher::to_multiple(4)),
          std::make_shared<PaddedDispatcher>(PaddedDispatcher::to_ladder({2, 4, 8}))};
}

TEST(Dispatch, LocalPlanIsExpertMajorAndStable) {
  // T = 3, K = 2: token 0 -> {2, 0}, token 1 -> {0, 1}, token 2 -> {2, 0}.
  std::vector<int32_t> ids{2, 0, 0, 1, 2, 0};
  Tensor w = Tensor::from_values({3, 2}, DType::f32, {.6, .4, .7, .3, .9, .1});
  DispatchPlan p = LocalDispatcher().plan(ids, w, 4);
  EXPECT_EQ(p.N, 6);
  EXPECT_EQ(p.count_E, (std::vector<int64_t>{3, 1, 2, 0}));
  EXPECT_EQ(p.offset_E, (std::vector<int64_t>{0, 3, 4, 6, 6}));
  // Within expert 0 the rows are in (token, slot) order.
  EXPECT_EQ(p.token_N, (std::vector<int32_t>{0, 1, 2, 1, 0, 2}));
  EXPECT_EQ(p.slot_N, (std::vector<int32_t>{1, 0, 1, 1, 0, 0}));
  for (int64_t i = 0; i < 6; ++i) {
    int64_t n = p.row_TK[size_t(i)];
    EXPECT_EQ(p.token_N[size_t(n)], i / 2);
    EXPECT_EQ(p.slot_N[size_t(n)], i % 2);
    EXPECT_EQ(p.score_N.get(n), w.get(i));
  }
}

TEST(Dispatch, PaddedPlanPadsEachExpertWithZeroScoreRows) {
  std::vector<int32_t> ids{2, 0, 0, 1, 2, 0};
  Tensor w = Tensor::from_values({3, 2}, DType::f64, {.6, .4, .7, .3, .9, .1});
  DispatchPlan p = PaddedDispatcher::to_multiple(4).plan(ids, w, 4);
  EXPECT_EQ(p.count_E, (std::vector<int64_t>{4, 4, 4, 0}));
  EXPECT_EQ(p.N, 12);
  EXPECT_EQ(p.padded_rows(), 6);
  for (int64_t n = 0; n < p.N; ++n) {
    if (p.token_N[size_t(n)] < 0) {
      EXPECT_EQ(p.slot_N[size_t(n)], -1);
      EXPECT_EQ(p.score_N.get(n), 0.0);
    }
  }
  PaddedDispatcher ladder = PaddedDispatcher::to_ladder({2, 4, 8});
  EXPECT_EQ(ladder.padded_count(0), 0);
  EXPECT_EQ(ladder.padded_count(1), 2);
  EXPECT_EQ(ladder.padded_count(3), 4);
  EXPECT_EQ(ladder.padded_count(8), 8);
  EXPECT_EQ(ladder.padded_count(9), 16);
  EXPECT_EQ(PaddedDispatcher::to_multiple(4).padded_count(5), 8);
}

// The invariant: identity experts and weights 1/K give back the input.
TEST(Dispatch, DispatchThenCombineWithIdentityExpertsReturnsInput) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (const auto& disp : all_dispatchers()) {
      Rng rng(7);
      const int64_t T = 13, E = 6, D = 5;
      for (int64_t K : {1, 2, 4}) {
      Routing r = fixed_routing(T, K, E, dt, rng);
      r.weights_TK.fill(1.0 / double(K));
      Tensor x = testing::random_tensor({T, D}, dt, rng);
      DispatchPlan p = disp->plan(r.ids_TK, r.weights_TK, E);
      Tensor x_ND = Tensor::empty({p.N, D}, dt), out = Tensor::empty({T, D}, dt);
      permute_forward(x_ND, x, p);
      combine_forward(out, x_ND, p, /*absorbed=*/false);
      std::string name = disp->name() + " " + std::string(dtype_name(dt)) + " K " + std::to_string(K);
      // x/2 + x/2 is exact; the running sum of four quarters may round once (3x/4).
      if (K <= 2) EXPECT_TRUE(testing::bitwise_equal(out, x, name));
      else EXPECT_TRUE(testing::all_close(out, x, dt == DType::f64 ? 1e-15 : 1e-6, 0, name));
      }
    }
  }
}

TEST(Dispatch, PermuteAndCombineBackwardMatchFiniteDifferences) {
  for (const auto& disp : all_dispatchers()) {
    for (bool absorbed : {false, true}) {
      Rng rng(11);
      const int64_t T = 7, K = 3, E = 5, D = 4;
      Routing r = fixed_routing(T, K, E, DType::f64, rng);
      Tensor x = testing::random_tensor({T, D}, DType::f64, rng);
      Tensor P = testing::random_tensor({T, D}, DType::f64, rng);
      DispatchPlan p = disp->plan(r.ids_TK, r.weights_TK, E);
      // Row-dependent "experts" (a fixed per-row scale) so rows are distinguishable.
      Tensor scale_N = testing::random_tensor({p.N}, DType::f64, rng);
      auto loss = [&]() {
        DispatchPlan q = disp->plan(r.ids_TK, r.weights_TK, E);
        Tensor x_ND = Tensor::empty({q.N, D}, DType::f64), out = Tensor::empty({T, D}, DType::f64);
        permute_forward(x_ND, x, q);
        for (int64_t i = 0; i < x_ND.numel(); ++i) x_ND.set(i, x_ND.get(i) * scale_N.get(i / D));
        combine_forward(out, x_ND, q, absorbed);
        return testing::projected_loss(out, P);
      };
      Tensor x_ND = Tensor::empty({p.N, D}, DType::f64);
      permute_forward(x_ND, x, p);
      Tensor y_ND = x_ND.clone();
      for (int64_t i = 0; i < y_ND.numel(); ++i) y_ND.set(i, y_ND.get(i) * scale_N.get(i / D));
      Tensor dy = Tensor::empty({p.N, D}, DType::f64), ds = Tensor::zeros({p.N}, DType::f64);
      combine_backward(dy, ds, P, absorbed ? Tensor() : y_ND, p, absorbed);
      for (int64_t i = 0; i < dy.numel(); ++i) dy.set(i, dy.get(i) * scale_N.get(i / D));
      Tensor dx = Tensor::empty({T, D}, DType::f64);
      permute_backward(dx, dy, p);
      std::string name = disp->name() + (absorbed ? " absorbed" : " post-combine");
      EXPECT_TRUE(testing::fd_check(loss, x, dx, name + " dx"));
      if (!absorbed) {
        Tensor dw = Tensor::empty({T, K}, DType::f64);
        scores_backward(dw, ds, p);
        EXPECT_TRUE(testing::fd_check(loss, r.weights_TK, dw, name + " dweights"));
      }
    }
  }
}

TEST(Dispatch, PermuteBackwardAccumulates) {
  Rng rng(3);
  Routing r = fixed_routing(4, 2, 3, DType::f64, rng);
  DispatchPlan p = LocalDispatcher().plan(r.ids_TK, r.weights_TK, 3);
  Tensor g = testing::random_tensor({p.N, 2}, DType::f64, rng);
  Tensor once = Tensor::empty({4, 2}, DType::f64);
  permute_backward(once, g, p);
  Tensor twice = once.clone();
  permute_backward(twice, g, p, /*accumulate=*/true);
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_DOUBLE_EQ(twice.get(i), 2 * once.get(i));
}

TEST(Dispatch, BadInputIsAClearError) {
  Tensor w = Tensor::from_values({2, 2}, DType::f32, {.5, .5, .5, .5});
  EXPECT_THROW(LocalDispatcher().plan({0, 1, 1, 7}, w, 4), Error);      // id out of range
  EXPECT_THROW(LocalDispatcher().plan({0, 1, 1}, w, 4), Error);         // ids vs weights
  EXPECT_THROW(LocalDispatcher().plan({0, 1, 1, 0}, w, 1), Error);      // K > E
  EXPECT_THROW(LocalDispatcher().plan({0, 1, 1, 0}, w.to(DType::bf16), 4), Error);
  EXPECT_THROW(PaddedDispatcher::to_multiple(0), Error);
  EXPECT_THROW(PaddedDispatcher::to_ladder({4, 2}), Error);
  EXPECT_THROW(PaddedDispatcher::to_ladder({}), Error);
  try {
    LocalDispatcher().plan({0, 1, 1, 7}, w, 4);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tiermoe
