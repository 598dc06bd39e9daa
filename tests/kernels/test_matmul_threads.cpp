// The cpu GEMM is called from several threads at once (the MoE layer runs
// experts in parallel). Cached oneDNN primitives are shared between threads,
// so each call must bring its own scratch memory; this test fails when two
// threads share one (seen as rare, large errors).
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>

#include "common/testing.h"
#include "tiermoe/kernels/matmul.h"

using namespace tiermoe;
using tiermoe::testing::random_tensor;

TEST(MatmulThreads, ConcurrentCallsMatchSerialResults) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Rng rng(11);
    // Several shapes that share primitives across threads.
    const std::vector<int64_t> rows = {7, 33, 64, 100};
    const int64_t N = 96, K = 160;
    Tensor w = random_tensor({N, K}, dt, rng);
    std::vector<Tensor> xs, want;
    for (int64_t m : rows) {
      xs.push_back(random_tensor({m, K}, dt, rng));
      want.push_back(Tensor::empty({m, N}, dt));
      cpu::matmul_forward(want.back(), xs.back(), w);
    }
    std::atomic<int> mismatches{0};
    const int kIters = 200;
#pragma omp parallel for num_threads(4) schedule(dynamic, 1)
    for (int it = 0; it < kIters; ++it) {
      size_t i = size_t(it) % rows.size();
      Tensor y = Tensor::empty({rows[i], N}, dt);
      cpu::matmul_forward(y, xs[i], w);
      if (std::memcmp(y.raw(), want[i].raw(), y.nbytes()) != 0) mismatches++;
    }
    EXPECT_EQ(mismatches.load(), 0) << dtype_name(dt);
  }
}
