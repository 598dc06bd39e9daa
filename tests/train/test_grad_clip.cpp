// Global-norm clipping (torch.nn.utils.clip_grad_norm_ semantics), the NaN
// guard, and gradient accumulation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/testing.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/train/grad_accum.h"
#include "tiermoe/train/grad_clip.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;

std::vector<Parameter> params_with_grads(DType dtype, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<Parameter> ps = {Parameter::create("model.a", {3, 5}, dtype),
                               Parameter::create("model.b", {10000}, dtype),
                               Parameter::create("model.c", {7}, dtype)};
  for (Parameter& p : ps) fill_normal(p.grad, rng, 0.0, scale);
  return ps;
}

double norm_by_hand(const std::vector<Parameter>& ps) {
  long double sum = 0;
  for (const Parameter& p : ps) {
    for (int64_t i = 0; i < p.grad.numel(); ++i) sum += (long double)p.grad.get(i) * p.grad.get(i);
  }
  return double(std::sqrt(sum));
}

TEST(GradClip, ScalesToMaxNormAndReturnsThePreClipNorm) {
  for (DType dt : {DType::f32, DType::f64}) {
    std::vector<Parameter> ps = params_with_grads(dt, 1);
    std::vector<Tensor> before;
    for (const Parameter& p : ps) before.push_back(p.grad.to(DType::f64));
    double want = norm_by_hand(ps);
    double total = clip_grad_norm(ps, 1.0);
    EXPECT_NEAR(total, want, want * 1e-12) << dtype_name(dt);
    double coef = 1.0 / (want + 1e-6);
    for (size_t k = 0; k < ps.size(); ++k) {
      for (int64_t i = 0; i < ps[k].grad.numel(); ++i) {
        ASSERT_NEAR(ps[k].grad.get(i), before[k].get(i) * coef, std::abs(before[k].get(i)) * 1e-6)
            << ps[k].name << "[" << i << "]";
      }
    }
    EXPECT_NEAR(norm_by_hand(ps), 1.0, 1e-5) << dtype_name(dt);
  }
}

TEST(GradClip, LeavesSmallGradientsUntouched) {
  std::vector<Parameter> ps = params_with_grads(DType::f32, 2, 1e-4);
  std::vector<Tensor> before;
  for (const Parameter& p : ps) before.push_back(p.grad.clone());
  double total = clip_grad_norm(ps, 1.0);
  EXPECT_LT(total, 1.0);
  for (size_t k = 0; k < ps.size(); ++k) EXPECT_TRUE(bitwise_equal(ps[k].grad, before[k], ps[k].name));
}

TEST(GradClip, NormDoesNotDependOnThreadCount) {
  std::vector<Parameter> ps = params_with_grads(DType::f32, 3);
  int saved = num_threads();
  set_num_threads(1);
  double one = global_grad_norm(ps);
  set_num_threads(3);
  double three = global_grad_norm(ps);
  set_num_threads(saved);
  EXPECT_EQ(one, three);
}

TEST(GradClip, NonFiniteGradientNamesTheParameter) {
  for (double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
    std::vector<Parameter> ps = params_with_grads(DType::f32, 4);
    ps[1].grad.set(1234, bad);
    ps[2].grad.set(0, bad);
    Tensor a_before = ps[0].grad.clone();
    try {
      clip_grad_norm(ps, 1.0);
      FAIL() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "model.b") << e.what();  // the first one in list order
      EXPECT_NE(e.message().find("non-finite"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bitwise_equal(ps[0].grad, a_before, "grads untouched on error"));
    EXPECT_THROW(global_grad_norm(ps), Error);
  }
}

TEST(GradClip, RejectsNonPositiveMaxNorm) {
  std::vector<Parameter> ps = params_with_grads(DType::f32, 5);
  EXPECT_THROW(clip_grad_norm(ps, 0.0), Error);
  EXPECT_THROW(clip_grad_norm(ps, NAN), Error);
}

TEST(GradAccum, AverageIsTheMeanOfTheMicroBatchGradients) {
  const int64_t accum = 3;
  std::vector<Parameter> ps = {Parameter::create("w", {1000}, DType::f32)};
  Rng rng(6);
  std::vector<Tensor> micro;
  for (int64_t k = 0; k < accum; ++k) micro.push_back(testing::random_tensor({1000}, DType::f32, rng));
  zero_grads(ps);
  for (const Tensor& g : micro) {
    float* acc = ps[0].grad.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) acc[i] += g.data<float>()[i];
  }
  average_accumulated_grads(ps, accum);
  for (int64_t i = 0; i < 1000; ++i) {
    float sum = (micro[0].data<float>()[i] + micro[1].data<float>()[i]) + micro[2].data<float>()[i];
    ASSERT_EQ(ps[0].grad.data<float>()[i], sum / 3.0f) << i;  // one correctly rounded division
  }
  zero_grads(ps);
  EXPECT_EQ(global_grad_norm(ps), 0.0);
  EXPECT_THROW(average_accumulated_grads(ps, 0), Error);
}

TEST(GradAccum, ScaleMultipliesByTheRoundedFactor) {
  std::vector<Parameter> ps = {Parameter::create("w", {3}, DType::f64)};
  ps[0].grad.fill(2.0);
  scale_grads(ps, 0.25);
  EXPECT_EQ(ps[0].grad.get(2), 0.5);
}

}  // namespace
}  // namespace tiermoe
