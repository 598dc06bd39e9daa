// Gated DeltaNet's causal depthwise conv + SiLU (kernels/causal_conv.h):
// a hand-computed case, finite differences for x and w, packed documents
// equal to each document alone, and its input checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>  // testing.h uses std::memcmp without including it
#include <vector>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/causal_conv.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

double silu(double v) { return v / (1 + std::exp(-v)); }

// One channel, K = 3, x = 1, 2, 3, 4 at t = 0..3, w = (0.5, -1, 2):
// pre_t = 0.5 x[t-2] - x[t-1] + 2 x[t], x before 0 reading 0.
TEST(CausalConv, ComputesTheCausalSumThenSilu) {
  const Tensor x = Tensor::from_values({1, 4, 1}, DType::f64, {1, 2, 3, 4});
  const Tensor w = Tensor::from_values({1, 3}, DType::f64, {0.5, -1, 2});
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  ref::causal_conv_silu_forward(y, x, w);
  const double pre[] = {2, 4 - 1, 6 - 2 + 0.5, 8 - 3 + 1};
  for (int t = 0; t < 4; ++t) EXPECT_DOUBLE_EQ(y.get(t), silu(pre[t])) << t;
  // A document starting at t = 2 reads nothing before it.
  const std::vector<int32_t> starts = {0, 0, 2, 2};
  ref::causal_conv_silu_forward(y, x, w, starts);
  EXPECT_DOUBLE_EQ(y.get(2), silu(6));
  EXPECT_DOUBLE_EQ(y.get(3), silu(8 - 3));
}

TEST(CausalConv, GradientsMatchFiniteDifferences) {
  Rng rng(4);
  Tensor x = random_tensor({2, 6, 5}, DType::f64, rng);
  Tensor w = random_tensor({5, 4}, DType::f64, rng);
  const Tensor P = random_tensor(x.shape(), DType::f64, rng);
  const std::vector<int32_t> starts = {0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 0, 5};
  auto loss = [&] {
    Tensor y = Tensor::empty(x.shape(), DType::f64);
    ref::causal_conv_silu_forward(y, x, w, starts);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += y.get(i) * P.get(i);
    return s;
  };
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  Tensor dw = Tensor::zeros(w.shape(), DType::f64);
  ref::causal_conv_silu_backward(dx, dw, P, x, w, starts);
  EXPECT_TRUE(fd_check(loss, x, dx, "x", 1e-6, 1e-9, 200));
  EXPECT_TRUE(fd_check(loss, w, dw, "w", 1e-6, 1e-9, 200));
}

TEST(CausalConv, BadInputsAreRefusedByName) {
  Rng rng(1);
  const Tensor x = random_tensor({1, 4, 3}, DType::f32, rng);
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  const Tensor w = random_tensor({2, 4}, DType::f32, rng);
  EXPECT_TRUE(throws_error_with([&] { ref::causal_conv_silu_forward(y, x, w); },
                                {"causal_conv_silu_forward", "w_CK", "one kernel"}));
  const Tensor w64 = random_tensor({3, 4}, DType::f64, rng);
  EXPECT_TRUE(throws_error_with([&] { ref::causal_conv_silu_forward(y, x, w64); }, {"w_CK"}));
}

}  // namespace

// cpu:: is ref:: bit for bit, forward and backward (dw added onto what it
// held), in every dtype, with packed documents, channels split over tasks
// unevenly, on 1 and 2 threads.
TEST(CausalConv, CpuEqualsRefBitwise) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " threads " + std::to_string(threads));
      set_num_threads(threads);
      Rng rng(5);
      const int64_t B = 2, T = 9, C = 600, K = 4;
      const Tensor x = random_tensor({B, T, C}, dt, rng), w = random_tensor({C, K}, dt, rng);
      const Tensor dy = random_tensor({B, T, C}, dt, rng);
      std::vector<int32_t> starts(size_t(B * T), 0);
      for (int64_t t = 4; t < T; ++t) starts[size_t(T + t)] = 4;
      Tensor a = Tensor::empty(x.shape(), dt), b = Tensor::empty(x.shape(), dt);
      ref::causal_conv_silu_forward(a, x, w, starts);
      cpu::causal_conv_silu_forward(b, x, w, starts);
      EXPECT_TRUE(bitwise_equal(b, a, "y"));
      const DType gd = dt == DType::f64 ? DType::f64 : DType::f32;
      Tensor dw_ref = random_tensor({C, K}, gd, rng), dw_cpu = dw_ref.clone();
      Tensor dx_ref = Tensor::empty(x.shape(), dt), dx_cpu = Tensor::empty(x.shape(), dt);
      ref::causal_conv_silu_backward(dx_ref, dw_ref, dy, x, w, starts);
      cpu::causal_conv_silu_backward(dx_cpu, dw_cpu, dy, x, w, starts);
      EXPECT_TRUE(bitwise_equal(dx_cpu, dx_ref, "dx"));
      EXPECT_TRUE(bitwise_equal(dw_cpu, dw_ref, "dw"));
      Tensor frozen;
      cpu::causal_conv_silu_backward(dx_cpu, frozen, dy, x, w, starts);
      EXPECT_TRUE(bitwise_equal(dx_cpu, dx_ref, "dx, w frozen"));
    }
  }
  set_num_threads(0);
}
