// Stored-width weights (kernels/matmul_mixed.h): the products equal those on
// the weight converted to the activations' dtype first, across several
// conversion blocks; the oracle agrees; a wider weight is refused.
#include <gtest/gtest.h>

#include <cstring>

#include "common/testing.h"
#include "tiermoe/kernels/matmul.h"
#include "tiermoe/kernels/matmul_mixed.h"

namespace tiermoe {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::random_tensor;

struct Case {
  DType act, stored;
};

class MatmulMixed : public ::testing::TestWithParam<Case> {};

// K = 2048 makes every conversion block smaller than the output (forward:
// 4 MiB / (K * 4 bytes) = 512 rows of w at f32; dx: 4 MiB / (N * 4) = 1498
// columns), so the products run in 2+ blocks and scatter their output columns.
constexpr int64_t M = 9, K = 2048, N = 700;

TEST_P(MatmulMixed, ForwardEqualsTheProductOnTheConvertedWeight) {
  const Case c = GetParam();
  Rng rng(1);
  Tensor x = random_tensor({M, K}, c.act, rng), w = random_tensor({N, K}, c.stored, rng, 0.05);
  Tensor y = Tensor::empty({M, N}, c.act), want = Tensor::empty({M, N}, c.act);
  cpu::matmul_forward_mixed(y, x, w);
  cpu::matmul_forward(want, x, w.to(c.act));
  // Bitwise: each output column is one whole product in either case (the
  // GEMMs' columns do not depend on how many are computed together).
  EXPECT_TRUE(bitwise_equal(y, want, "y"));
  Tensor oracle = Tensor::empty({M, N}, c.act);
  ref::matmul_forward_mixed(oracle, x, w);
  EXPECT_TRUE(all_close(y, oracle, c.act == DType::f64 ? 1e-13 : 2e-5, 1e-5, "y vs ref"));

  // accumulate: the product added to what is there.
  Tensor acc = y.clone();
  cpu::matmul_forward_mixed(acc, x, w, /*accumulate=*/true);
  for (int64_t i = 0; i < acc.numel(); i += 997) {
    EXPECT_DOUBLE_EQ(acc.get(i), c.act == DType::f64 ? y.get(i) + y.get(i)
                                                     : double(float(y.get(i)) + float(y.get(i))));
  }
}

TEST_P(MatmulMixed, BackwardDxEqualsTheProductOnTheConvertedWeight) {
  const Case c = GetParam();
  Rng rng(2);
  Tensor dy = random_tensor({M, N}, c.act, rng), w = random_tensor({N, K}, c.stored, rng, 0.05);
  Tensor dx = Tensor::empty({M, K}, c.act), want = Tensor::empty({M, K}, c.act);
  cpu::matmul_backward_dx_mixed(dx, dy, w);
  cpu::matmul_backward_dx(want, dy, w.to(c.act));
  // Bitwise in f32 too: TierMoE's GEMM sums every output element as one FMA
  // chain over the reduction in order, whatever the output width
  // (gemm/microkernel.h), and gemm_f64 sums in ref's order. The frozen-weight
  // path relies on it: a model on stored-width weights gives the bits of one
  // on widened copies (tests/model/test_model_mapped.cpp).
  EXPECT_TRUE(bitwise_equal(dx, want, "dx"));
  Tensor oracle = Tensor::empty({M, K}, c.act);
  ref::matmul_backward_dx_mixed(oracle, dy, w);
  EXPECT_TRUE(all_close(dx, oracle, c.act == DType::f64 ? 1e-13 : 2e-5, 1e-5, "dx vs ref"));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MatmulMixed,
                         ::testing::Values(Case{DType::f32, DType::bf16},
                                           Case{DType::f64, DType::bf16},
                                           Case{DType::f64, DType::f32}),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.act)) + "_x_" +
                                  std::string(dtype_name(info.param.stored));
                         });

TEST(MatmulMixed, SameDtypeIsThePlainProduct) {
  Rng rng(4);
  Tensor x = random_tensor({9, 40}, DType::f64, rng), w = random_tensor({30, 40}, DType::f64, rng);
  Tensor y = Tensor::empty({9, 30}, DType::f64), want = Tensor::empty({9, 30}, DType::f64);
  cpu::matmul_forward_mixed(y, x, w);
  cpu::matmul_forward(want, x, w);
  EXPECT_TRUE(bitwise_equal(y, want));
}

TEST(MatmulMixed, AWiderWeightIsRefused) {
  Rng rng(5);
  Tensor x = random_tensor({4, 8}, DType::f32, rng), w = random_tensor({6, 8}, DType::f64, rng);
  Tensor y = Tensor::empty({4, 6}, DType::f32);
  try {
    cpu::matmul_forward_mixed(y, x, w);
    FAIL() << "an f64 weight under f32 activations was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wider than the activations"), std::string::npos)
        << e.what();
  }
  Tensor bad = Tensor::empty({4, 7}, DType::f32), wb = random_tensor({6, 8}, DType::bf16, rng);
  EXPECT_THROW(cpu::matmul_forward_mixed(bad, x, wb), Error);
}

}  // namespace
}  // namespace tiermoe
