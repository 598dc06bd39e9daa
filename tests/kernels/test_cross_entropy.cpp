#include <gtest/gtest.h>

#include <cstring>  // testing.h uses std::memcmp without including it
#include <vector>

#include "common/testing.h"
#include "tiermoe/kernels/cross_entropy.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

std::vector<int32_t> random_targets(int64_t N, int64_t V, Rng& rng, bool with_ignored) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < N; ++i) {
    t.push_back(with_ignored && i % 3 == 1 ? kIgnoreIndex : int32_t(rng.below(uint64_t(V))));
  }
  return t;
}

// Independent f64 loss: mean over counted rows of logsumexp - logit[target].
double loss_f64(const Tensor& logits, const std::vector<int32_t>& targets) {
  int64_t V = logits.size(1);
  double total = 0;
  int64_t count = 0;
  for (size_t t = 0; t < targets.size(); ++t) {
    if (targets[t] == kIgnoreIndex) continue;
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, logits.get(int64_t(t) * V + v));
    for (int64_t v = 0; v < V; ++v) s += std::exp(logits.get(int64_t(t) * V + v) - m);
    total += m + std::log(s) - logits.get(int64_t(t) * V + targets[t]);
    ++count;
  }
  return count ? total / double(count) : 0.0;
}

}  // namespace

// cpu:: reduces each row in vectorized order, ref:: left to right: per-row
// losses and softmax values differ by a few ulps of the math dtype (f32 even
// for bf16 logits), well inside 1e-12 (f64) and 1e-5 (f32); a bf16 gradient
// may then round one bf16 ulp apart (2^-7 relative). The absolute floor
// covers gradient entries that are differences (p - 1) near zero.
TEST(CrossEntropy, CpuMatchesRef) {
  Rng rng(51);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    double loss_tol = dt == DType::f64 ? 1e-12 : 1e-5;
    double grad_rtol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : 1.0 / 128;
    for (auto [N, V] : {std::pair{1, 7}, {3, 64}, {17, 130}, {5, 5000}}) {
      for (bool with_ignored : {false, true}) {
        Tensor logits = random_tensor({N, V}, dt, rng, 3.0);
        std::vector<int32_t> targets = random_targets(N, V, rng, with_ignored);
        Tensor d_ref = Tensor::empty({N, V}, dt), d_cpu = Tensor::empty({N, V}, dt);
        double l_ref = ref::cross_entropy_forward_backward(d_ref, logits, targets, 0.7);
        double l_cpu = cpu::cross_entropy_forward_backward(d_cpu, logits, targets, 0.7);
        std::string what = logits.str() + (with_ignored ? " with ignored" : "");
        EXPECT_NEAR(l_cpu, l_ref, loss_tol * std::abs(l_ref)) << what;
        EXPECT_NEAR(cpu::cross_entropy_forward(logits, targets), l_ref, loss_tol * std::abs(l_ref))
            << what;
        EXPECT_NEAR(ref::cross_entropy_forward(logits, targets), l_ref, 0) << what;
        // The loss in f32 math against an f64 evaluation of the same logits.
        EXPECT_NEAR(l_ref, loss_f64(logits, targets), loss_tol * std::abs(l_ref) + 1e-12) << what;
        double scale = 0.7 / double(N);  // an upper bound on every gradient entry
        EXPECT_TRUE(
            all_close(d_cpu, d_ref, grad_rtol, grad_rtol * scale * 1e-2, "dlogits " + what));
      }
    }
  }
}

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  Tensor logits = Tensor::zeros({2, 8}, DType::f64);
  std::vector<int32_t> targets = {3, 5};
  Tensor d = Tensor::empty({2, 8}, DType::f64);
  EXPECT_NEAR(cpu::cross_entropy_forward_backward(d, logits, targets), std::log(8.0), 1e-15);
  for (int64_t v = 0; v < 8; ++v) {
    EXPECT_NEAR(d.get(v), (1.0 / 8 - (v == 3)) / 2, 1e-16);
    EXPECT_NEAR(d.get(8 + v), (1.0 / 8 - (v == 5)) / 2, 1e-16);
  }
}

TEST(CrossEntropy, IgnoredTargetsAreSkippedAndAllIgnoredIsZero) {
  Rng rng(52);
  Tensor logits = random_tensor({4, 6}, DType::f32, rng, 2.0);
  std::vector<int32_t> some = {2, kIgnoreIndex, 0, kIgnoreIndex};
  Tensor d = Tensor::empty({4, 6}, DType::f32);
  d.fill(9);
  double loss = cpu::cross_entropy_forward_backward(d, logits, some);
  EXPECT_NEAR(loss, loss_f64(logits, some), 1e-6);  // the mean is over the 2 counted rows
  for (int64_t v = 0; v < 6; ++v) {
    EXPECT_EQ(d.get(6 + v), 0.0);
    EXPECT_EQ(d.get(18 + v), 0.0);
  }
  std::vector<int32_t> none(4, kIgnoreIndex);
  for (int twin = 0; twin < 2; ++twin) {
    d.fill(9);
    double l = twin ? cpu::cross_entropy_forward_backward(d, logits, none)
                    : ref::cross_entropy_forward_backward(d, logits, none);
    EXPECT_EQ(l, 0.0);
    for (int64_t i = 0; i < d.numel(); ++i) ASSERT_EQ(d.get(i), 0.0);
  }
  Tensor empty_logits = Tensor::empty({0, 6}, DType::f32);
  EXPECT_EQ(cpu::cross_entropy_forward(empty_logits, {}), 0.0);
}

TEST(CrossEntropy, LargeLogitsStayFinite) {
  // Exact in bf16 (whose spacing near 1000 is 4).
  Tensor logits = Tensor::from_values({1, 3}, DType::bf16, {1000, 992, -1000});
  std::vector<int32_t> targets = {1};
  Tensor d = Tensor::empty({1, 3}, DType::bf16);
  double loss = cpu::cross_entropy_forward_backward(d, logits, targets);
  EXPECT_NEAR(loss, 8 + std::log1p(std::exp(-8.0)), 1e-5);
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(std::isfinite(d.get(i)));
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  Rng rng(53);
  Tensor logits = random_tensor({5, 9}, DType::f64, rng, 2.0);
  std::vector<int32_t> targets = {4, kIgnoreIndex, 0, 8, 4};
  for (bool use_cpu : {false, true}) {
    auto loss = [&] {
      return 2.5 * (use_cpu ? cpu::cross_entropy_forward(logits, targets)
                            : ref::cross_entropy_forward(logits, targets));
    };
    Tensor d = Tensor::empty({5, 9}, DType::f64);
    use_cpu ? cpu::cross_entropy_forward_backward(d, logits, targets, 2.5)
            : ref::cross_entropy_forward_backward(d, logits, targets, 2.5);
    EXPECT_TRUE(fd_check(loss, logits, d, use_cpu ? "cpu dlogits" : "ref dlogits", 1e-6, 1e-9, 45));
  }
}

TEST(CrossEntropy, BadTargetsAndShapesThrow) {
  Tensor logits = Tensor::zeros({3, 10}, DType::f32);
  Tensor d = Tensor::empty({3, 10}, DType::f32);
  for (int32_t bad : {10, -1, -101}) {
    std::vector<int32_t> targets = {0, bad, 1};
    for (int twin = 0; twin < 2; ++twin) {
      try {
        twin ? cpu::cross_entropy_forward_backward(d, logits, targets)
             : ref::cross_entropy_forward_backward(d, logits, targets);
        FAIL() << "target " << bad << " accepted";
      } catch (const Error& e) {
        EXPECT_NE(e.message().find("targets_N[1] = " + std::to_string(bad)), std::string::npos)
            << e.what();
      }
    }
  }
  std::vector<int32_t> short_targets = {0, 1};
  EXPECT_THROW(cpu::cross_entropy_forward(logits, short_targets), Error);
  std::vector<int32_t> targets = {0, 1, 2};
  Tensor d_bad = Tensor::empty({3, 9}, DType::f32);
  EXPECT_THROW(cpu::cross_entropy_forward_backward(d_bad, logits, targets), Error);
  Tensor d_bf16 = Tensor::empty({3, 10}, DType::bf16);
  EXPECT_THROW(ref::cross_entropy_forward_backward(d_bf16, logits, targets), Error);
}
