// matmul: cpu against the ref oracle, every backward against f64 finite
// differences, the row-count invariance the device tier's parity relies on,
// and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>  // common/testing.h uses std::memcmp without including it
#include <fstream>
#include <sstream>
#include <string>

#include "common/testing.h"
#include "kernels/matmul_test_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/cpu_features.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe {
namespace {

using testing::abs_f64;
using testing::all_close;
using testing::bitwise_equal;
using testing::Op;
using testing::op_name;
using testing::Operands;
using testing::operands;
using testing::random_tensor;
using testing::run;
using testing::within_summation_bound;

struct DTypes {
  DType in, out;
};

std::string dtypes_name(const ::testing::TestParamInfo<DTypes>& info) {
  return std::string(dtype_name(info.param.in)) + "_to_" + std::string(dtype_name(info.param.out));
}

class MatmulDtypes : public ::testing::TestWithParam<DTypes> {};

INSTANTIATE_TEST_SUITE_P(Matmul, MatmulDtypes,
                         ::testing::Values(DTypes{DType::f64, DType::f64},
                                           DTypes{DType::f32, DType::f32},
                                           DTypes{DType::bf16, DType::bf16},
                                           DTypes{DType::bf16, DType::f32}),
                         dtypes_name);

TEST_P(MatmulDtypes, CpuMatchesRef) {
  auto [in, out_dt] = GetParam();
  Rng rng(7);
  const int64_t shapes[][3] = {{1, 1, 1},     {1, 3, 17},     {3, 17, 64},   {17, 64, 3},
                               {64, 100, 17}, {100, 17, 100}, {5, 128, 256}, {128, 96, 300}};
  for (auto [M, N, K] : shapes) {
    for (Op op : {Op::forward, Op::dx, Op::dw}) {
      for (bool accumulate : {false, true}) {
        std::string name = std::string(op_name(op)) + " M" + std::to_string(M) + " N" +
                           std::to_string(N) + " K" + std::to_string(K) +
                           (accumulate ? " accumulate" : "");
        Operands s = operands(op, M, N, K);
        Tensor a = random_tensor(s.a, in, rng), b = random_tensor(s.b, in, rng);
        Tensor old = random_tensor(s.out, out_dt, rng);
        Tensor got = old.clone(), want = old.clone();
        run(op, /*cpu=*/true, got, a, b, accumulate);
        run(op, /*cpu=*/false, want, a, b, accumulate);
        if (in == DType::f64) {
          // gemm_f64 sums in ref's order with ref's arithmetic (no FMA).
          EXPECT_TRUE(bitwise_equal(got, want, name));
          continue;
        }
        Tensor absdot = Tensor::empty(s.out, DType::f64);
        run(op, /*cpu=*/false, absdot, abs_f64(a), abs_f64(b), false);
        EXPECT_TRUE(within_summation_bound(got, want, absdot, accumulate ? old : Tensor(),
                                           s.reduction, DType::f32, name));
      }
    }
  }
}

// Row i of forward and dx must not depend on how many rows are computed
// with it, nor where they sit: the device tier pads an expert's rows to a
// bucket and must match the host bitwise. The 160-row product is the
// reference; each range is computed alone from a view. accumulate (a sum
// post-op on the same kernel) is covered on the small shape only, to keep
// the test fast.
TEST_P(MatmulDtypes, ForwardAndDxRowsIndependentOfRowCount) {
  auto [in, out_dt] = GetParam();
  Rng rng(11);
  const int64_t rows = 160;
  const int64_t ranges[][2] = {{0, 1},   {0, 5},    {3, 8},   {0, 64},
                               {0, 100}, {17, 117}, {0, 128}, {100, 160}};
  // (N, K): Qwen3-30B-A3B's W13 [2F, D] and W2 [D, F], an odd small one, and
  // one like an LM head's, too large for the driver to pack once for all
  // rows (over 32 MB: products of more than one block of rows take tall
  // blocks instead, gemm/driver.h).
  std::vector<std::pair<int64_t, int64_t>> weights = {
      {1536, 2048}, {2048, 768}, {100, 17}, {8400 + 5, 2048}};
  if (in == DType::f64) {
    weights = {{96, 200}, {100, 17}};  // the f64 GEMM is slow, and exact by construction
  }
  for (auto [N, K] : weights) {
    for (Op op : {Op::forward, Op::dx}) {
      for (bool accumulate : {false, true}) {
        if (accumulate && N * K > 100000) continue;
        Operands s = operands(op, rows, N, K);
        Tensor a = random_tensor(s.a, in, rng), b = random_tensor(s.b, in, rng);
        Tensor old = random_tensor(s.out, out_dt, rng);
        Tensor all = old.clone();
        run(op, true, all, a, b, accumulate);
        for (auto [begin, end] : ranges) {
          Tensor part = old.rows(begin, end).clone();
          run(op, true, part, a.rows(begin, end), b, accumulate);
          EXPECT_TRUE(bitwise_equal(part, all.rows(begin, end),
                                    std::string(op_name(op)) + " N" + std::to_string(N) + " K" +
                                        std::to_string(K) + " rows [" + std::to_string(begin) +
                                        ", " + std::to_string(end) + ")" +
                                        (accumulate ? " accumulate" : "")));
        }
      }
    }
  }
}

// dw sums over rows: appending zero rows to dy and x (M -> a bucket) must
// leave it bitwise unchanged.
TEST_P(MatmulDtypes, DwUnchangedByZeroRows) {
  auto [in, out_dt] = GetParam();
  Rng rng(13);
  const int64_t pads[][2] = {{1, 8}, {5, 64}, {30, 32}, {100, 128}, {17, 256}};
  std::vector<std::pair<int64_t, int64_t>> weights = {{1536, 2048}, {2048, 768}, {100, 17}};
  if (in == DType::f64) weights = {{96, 200}, {100, 17}};
  for (auto [N, K] : weights) {
    for (auto [M, bucket] : pads) {
      Tensor dy = Tensor::zeros({bucket, N}, in), x = Tensor::zeros({bucket, K}, in);
      Tensor dy_rows = dy.rows(0, M), x_rows = x.rows(0, M);
      dy_rows.copy_from(random_tensor({M, N}, in, rng));
      x_rows.copy_from(random_tensor({M, K}, in, rng));
      Tensor exact = Tensor::empty({N, K}, out_dt), padded = Tensor::empty({N, K}, out_dt);
      cpu::matmul_backward_dw(exact, dy_rows, x_rows);
      cpu::matmul_backward_dw(padded, dy, x);
      EXPECT_TRUE(bitwise_equal(padded, exact,
                                "dw N" + std::to_string(N) + " K" + std::to_string(K) + " M " +
                                    std::to_string(M) + " -> " + std::to_string(bucket)));
    }
  }
}

// The work split changes with the thread count, the sums must not: an EP
// rank or a device tier may run with fewer threads than the host.
TEST_P(MatmulDtypes, ResultsIndependentOfThreadCount) {
  auto [in, out_dt] = GetParam();
  Rng rng(17);
  // The last: B over 32 MB, so tall blocks of rows; its dx's K is too long
  // to keep A, so one thread takes both column blocks through K together
  // (gemm/driver.h) where three take one block each.
  const int64_t shapes[][3] = {{1, 1536, 2048}, {40, 2048, 768}, {128, 100, 17}, {200, 40000, 450}};
  for (auto [M, N, K] : shapes) {
    if (in == DType::f64 && N * K > 100000) continue;  // exact by construction, and slow
    for (Op op : {Op::forward, Op::dx, Op::dw}) {
      Operands s = operands(op, M, N, K);
      Tensor a = random_tensor(s.a, in, rng), b = random_tensor(s.b, in, rng);
      Tensor one = Tensor::empty(s.out, out_dt), many = Tensor::empty(s.out, out_dt);
      set_num_threads(1);
      run(op, true, one, a, b, false);
      set_num_threads(3);  // more threads than this machine may have cores: still correct
      run(op, true, many, a, b, false);
      set_num_threads(0);
      EXPECT_TRUE(bitwise_equal(many, one,
                                std::string(op_name(op)) + " M" + std::to_string(M) + " N" +
                                    std::to_string(N) + " K" + std::to_string(K)));
    }
  }
}

// Gradients of loss = sum(y * r), y = x . w^T, for a fixed random r:
// dloss/dx = r . w (backward_dx with dy = r), dloss/dw = r^T . x.
TEST(Matmul, BackwardMatchesFiniteDifferences) {
  Rng rng(3);
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 4, 9}, {6, 33, 2}};
  for (bool cpu : {false, true}) {
    for (auto [M, N, K] : shapes) {
      Tensor x = random_tensor({M, K}, DType::f64, rng), w = random_tensor({N, K}, DType::f64, rng);
      Tensor r = random_tensor({M, N}, DType::f64, rng);
      auto loss = [&] {
        Tensor y = Tensor::empty({M, N}, DType::f64);
        ref::matmul_forward(y, x, w);
        double sum = 0;
        for (int64_t i = 0; i < y.numel(); ++i) sum += y.get(i) * r.get(i);
        return sum;
      };
      Tensor dx = Tensor::empty({M, K}, DType::f64), dw = Tensor::empty({N, K}, DType::f64);
      run(Op::dx, cpu, dx, r, w, false);
      run(Op::dw, cpu, dw, r, x, false);
      std::string where = std::string(cpu ? "cpu" : "ref") + " M" + std::to_string(M) + " N" +
                          std::to_string(N) + " K" + std::to_string(K);
      EXPECT_TRUE(testing::fd_check(loss, x, dx, "dx " + where));
      EXPECT_TRUE(testing::fd_check(loss, w, dw, "dw " + where));
    }
  }
}

// An expert that receives no rows: forward and dx do nothing, dw is zero (or
// unchanged when accumulating), and a zero-length reduction gives zeros.
TEST_P(MatmulDtypes, EmptyDimensions) {
  auto [in, out_dt] = GetParam();
  Rng rng(5);
  for (bool cpu : {false, true}) {
    Tensor w = random_tensor({6, 4}, in, rng);
    Tensor none = Tensor::empty({0, 4}, in), dy_none = Tensor::empty({0, 6}, in);
    Tensor y = Tensor::empty({0, 6}, out_dt);
    run(Op::forward, cpu, y, none, w, false);
    Tensor dw = random_tensor({6, 4}, out_dt, rng), dw_old = dw.clone();
    run(Op::dw, cpu, dw, dy_none, none, /*accumulate=*/true);
    EXPECT_TRUE(bitwise_equal(dw, dw_old, "dw += nothing"));
    run(Op::dw, cpu, dw, dy_none, none, false);
    EXPECT_TRUE(all_close(dw, Tensor::zeros({6, 4}, out_dt), 0, 0, "dw = nothing"));
    Tensor y_k0 = random_tensor({3, 6}, out_dt, rng);
    run(Op::forward, cpu, y_k0, Tensor::empty({3, 0}, in), Tensor::empty({6, 0}, in), false);
    EXPECT_TRUE(all_close(y_k0, Tensor::zeros({3, 6}, out_dt), 0, 0, "y with K = 0"));
  }
}

TEST(Matmul, RejectsBadArguments) {
  Rng rng(1);
  auto t = [&](Shape s, DType dt = DType::f32) { return random_tensor(s, dt, rng); };
  for (bool cpu : {false, true}) {
    Tensor y = t({3, 4});
    // K mismatch between x and w.
    EXPECT_THROW(run(Op::forward, cpu, y, t({3, 5}), t({4, 6}), false), Error);
    // Output of the wrong shape.
    Tensor y_bad = t({4, 3});
    EXPECT_THROW(run(Op::forward, cpu, y_bad, t({3, 5}), t({4, 5}), false), Error);
    // Not a matrix.
    Tensor y3 = t({1, 3, 4});
    EXPECT_THROW(run(Op::forward, cpu, y3, t({3, 5}), t({4, 5}), false), Error);
    // Mixed input dtypes.
    EXPECT_THROW(run(Op::forward, cpu, y, t({3, 5}), t({4, 5}, DType::bf16), false), Error);
    // f32 inputs cannot write bf16, bf16 inputs cannot write f64.
    Tensor y_bf16 = t({3, 4}, DType::bf16), y_f64 = t({3, 4}, DType::f64);
    EXPECT_THROW(run(Op::forward, cpu, y_bf16, t({3, 5}), t({4, 5}), false), Error);
    EXPECT_THROW(
        run(Op::forward, cpu, y_f64, t({3, 5}, DType::bf16), t({4, 5}, DType::bf16), false), Error);
    // Undefined operand.
    EXPECT_THROW(run(Op::forward, cpu, y, Tensor(), t({4, 5}), false), Error);
    // dx: w's rows must match dy's columns; dw: dy and x must share M.
    Tensor dx = t({3, 5});
    EXPECT_THROW(run(Op::dx, cpu, dx, t({3, 4}), t({5, 5}), false), Error);
    Tensor dw = t({4, 5});
    EXPECT_THROW(run(Op::dw, cpu, dw, t({3, 4}), t({2, 5}), false), Error);
    // The output may not overlap an input.
    Tensor square = t({4, 4});
    EXPECT_THROW(run(Op::forward, cpu, square, square, t({4, 4}), false), Error);
  }
  try {
    Tensor y = t({3, 4});
    cpu::matmul_forward(y, t({3, 5}), t({4, 6}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w_NK"), std::string::npos) << e.what();
  }
}

// CPUID answers agree with the kernel's view in /proc/cpuinfo.
TEST(CpuFeatures, AgreeWithProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  auto has = [&](const std::string& f) { return flags.find(" " + f + " ") != std::string::npos; };
  EXPECT_EQ(has_avx512f(), has("avx512f"));
  EXPECT_EQ(has_avx512_bf16(), has("avx512_bf16"));
  EXPECT_EQ(has_amx_bf16(), has("amx_bf16") && has("amx_tile"));
  EXPECT_TRUE(!has_avx512_bf16() || has_avx512f());
  // Permission is granted exactly when the CPU has AMX (Linux 5.16+).
  EXPECT_EQ(request_amx_permission(), has_amx_bf16());
  EXPECT_EQ(request_amx_permission(), has_amx_bf16());  // idempotent
}

}  // namespace
}  // namespace tiermoe
