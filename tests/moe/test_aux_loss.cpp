// The Hugging Face load-balancing aux loss: a hand-computed value, its gradient
// by finite differences, and its gradient through Router::backward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>  // common/testing.h uses std::memcmp

#include "common/testing.h"
#include "tiermoe/moe/aux_loss.h"
#include "tiermoe/moe/router.h"

namespace tiermoe {
namespace {

using testing::fd_check;
using testing::random_tensor;

Routing routing_from_logits(const Tensor& logits_TE, int64_t K) {
  Routing r;
  r.T = logits_TE.size(0);
  r.K = K;
  r.logits_TE = logits_TE;
  return r;
}

TEST(AuxLoss, HandComputedValue) {
  // Rows (0, ln 3) -> p = (1/4, 3/4), top-1 = expert 1, twice; row (0, 0) -> p = (1/2, 1/2),
  // a tie, top-1 = expert 0. c = (1, 2), P = (1/3, 2/3): aux = 2 * (1/3 * 1/3 + 2/3 * 2/3) = 10/9.
  // The rows are split over two layers (2 + 1 tokens): the loss concatenates them.
  const double l3 = std::log(3.0);
  Routing a = routing_from_logits(Tensor::from_values({2, 2}, DType::f64, {0, l3, 0, l3}), 1);
  Routing b = routing_from_logits(Tensor::from_values({1, 2}, DType::f64, {0, 0}), 1);
  const Routing* layers[] = {&a, &b};
  AuxLoss aux = aux_loss_forward(layers);
  EXPECT_NEAR(aux.value, 10.0 / 9.0, 1e-15);
  EXPECT_EQ(aux.count_E, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(aux.rows, 3);
  EXPECT_NEAR(aux.mean_prob_E[0], 1.0 / 3.0, 1e-15);

  // K = 2 of E = 2 picks everyone: c = (3, 3), aux = 2 * (1 * 1/3 + 1 * 2/3) = 2.
  Routing a2 = routing_from_logits(a.logits_TE, 2), b2 = routing_from_logits(b.logits_TE, 2);
  const Routing* layers2[] = {&a2, &b2};
  EXPECT_NEAR(aux_loss_forward(layers2).value, 2.0, 1e-15);
}

TEST(AuxLoss, GradientMatchesFiniteDifferences) {
  Rng rng(9);
  const int64_t E = 6, K = 2;
  Routing a = routing_from_logits(random_tensor({5, E}, DType::f64, rng), K);
  Routing b = routing_from_logits(random_tensor({4, E}, DType::f64, rng), K);
  const Routing* layers[] = {&a, &b};
  const AuxLoss base = aux_loss_forward(layers);
  auto loss = [&] {
    AuxLoss aux = aux_loss_forward(layers);
    EXPECT_EQ(aux.count_E, base.count_E) << "a top-k choice flipped under the perturbation";
    return aux.value;
  };
  Tensor grads[2];
  grads[1] = Tensor::zeros({4, E}, DType::f64);
  grads[1].fill(0.5);  // accumulate adds to what is there
  aux_loss_backward(grads, 1.0, base, layers, /*accumulate=*/true);
  for (int64_t i = 0; i < grads[1].numel(); ++i) grads[1].set(i, grads[1].get(i) - 0.5);
  EXPECT_TRUE(fd_check(loss, a.logits_TE, grads[0], "dlogits layer 0", 1e-6, 1e-10));
  EXPECT_TRUE(fd_check(loss, b.logits_TE, grads[1], "dlogits layer 1", 1e-6, 1e-10));
  // daux scales the gradient.
  Tensor scaled[2];
  aux_loss_backward(scaled, 0.25, base, layers);
  EXPECT_TRUE(testing::all_close(scaled[0], [&] {
    Tensor t = grads[0].clone();
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 0.25 * t.get(i));
    return t;
  }(), 1e-15, 0, "0.25 * dlogits"));
}

TEST(AuxLoss, FlowsThroughRouterBackward) {
  // loss = sum(weights * c) + coef * aux over two Qwen-style layers, differentiated
  // with respect to the routers' inputs and weights.
  Rng rng(17);
  RouterConfig cfg;
  cfg.hidden = 8, cfg.num_experts = 6, cfg.top_k = 2, cfg.norm_topk_prob = true;
  Router r0(cfg, DType::f64, "layer0"), r1(cfg, DType::f64, "layer1");
  fill_normal(r0.param("weight"), rng, 0, 0.5);
  fill_normal(r1.param("weight"), rng, 0, 0.5);
  Tensor x0 = random_tensor({5, 8}, DType::f64, rng), x1 = random_tensor({5, 8}, DType::f64, rng);
  Tensor c0 = random_tensor({5, 2}, DType::f64, rng), c1 = random_tensor({5, 2}, DType::f64, rng);
  const double coef = 0.3;
  auto loss = [&] {
    Routing a = r0.forward(x0), b = r1.forward(x1);
    const Routing* layers[] = {&a, &b};
    double sum = coef * aux_loss_forward(layers).value;
    for (int64_t i = 0; i < 10; ++i) {
      sum += a.weights_TK.get(i) * c0.get(i) + b.weights_TK.get(i) * c1.get(i);
    }
    return sum;
  };
  Routing a = r0.forward(x0), b = r1.forward(x1);
  const Routing* layers[] = {&a, &b};
  AuxLoss aux = aux_loss_forward(layers);
  Tensor dlogits[2];
  aux_loss_backward(dlogits, coef, aux, layers);
  Tensor dx0 = Tensor::empty({5, 8}, DType::f64), dx1 = Tensor::empty({5, 8}, DType::f64);
  r0.backward(dx0, c0, dlogits[0], x0, a);
  r1.backward(dx1, c1, dlogits[1], x1, b);
  EXPECT_TRUE(fd_check(loss, x0, dx0, "dx layer 0", 1e-6, 1e-9));
  EXPECT_TRUE(fd_check(loss, x1, dx1, "dx layer 1", 1e-6, 1e-9));
  EXPECT_TRUE(fd_check(loss, r0.param("weight"), r0.grad("weight"), "dweight layer 0", 1e-6, 1e-9));
  // The aux term matters: without it the router gradient differs.
  Tensor dx_plain = Tensor::empty({5, 8}, DType::f64);
  r0.backward(dx_plain, c0, x0, a);
  EXPECT_FALSE(testing::all_close(dx_plain, dx0, 1e-6, 1e-9));
}

TEST(AuxLoss, RejectsMismatchedLayers) {
  Routing a = routing_from_logits(Tensor::zeros({2, 4}, DType::f64), 1);
  Routing b = routing_from_logits(Tensor::zeros({2, 5}, DType::f64), 1);
  const Routing* layers[] = {&a, &b};
  EXPECT_THROW(aux_loss_forward(layers), Error);
  EXPECT_THROW(aux_loss_forward(std::span<const Routing* const>()), Error);
}

}  // namespace
}  // namespace tiermoe
