// The GEMM kernels on every ISA this machine can run (kernels/cpu_isa.h),
// through the cpu:: matmuls: against the ref oracle for the row counts an
// expert sees, and the invariances the device tier's parity relies on, row by
// row and bit for bit. An ISA the machine lacks is skipped, and says why.
#include <gtest/gtest.h>

#include <bit>
#include <string>
#include <vector>

#include "common/testing.h"
#include "kernels/isa_test_util.h"
#include "kernels/matmul_test_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe {
namespace {

using testing::abs_f64;
using testing::bitwise_equal;
using testing::Op;
using testing::op_name;
using testing::Operands;
using testing::operands;
using testing::random_tensor;
using testing::run;
using testing::ScopedIsa;
using testing::within_summation_bound;

struct IsaCase {
  CpuIsa isa;
  DType in, out;
};

std::string case_name(const ::testing::TestParamInfo<IsaCase>& info) {
  std::string isa(cpu_isa_name(info.param.isa));
  for (char& c : isa) c = c == '-' ? '_' : c;
  return isa + "_" + std::string(dtype_name(info.param.in)) + "_to_" +
         std::string(dtype_name(info.param.out));
}

constexpr CpuIsa kIsas[] = {CpuIsa::avx2,   CpuIsa::avx512,     CpuIsa::avx512bf16,
                            CpuIsa::amx,    CpuIsa::avx512_emu, CpuIsa::avx512bf16_emu,
                            CpuIsa::amx_emu};

// Every TierMoE ISA (not the onednn baseline), each with f32 -> f32,
// bf16 -> bf16 and bf16 -> f32 (the unrounded sums of a weight gradient).
std::vector<IsaCase> all_cases() {
  std::vector<IsaCase> v;
  for (CpuIsa isa : kIsas) {
    v.push_back({isa, DType::f32, DType::f32});
    v.push_back({isa, DType::bf16, DType::bf16});
    v.push_back({isa, DType::bf16, DType::f32});
  }
  return v;
}


using GemmIsa = testing::IsaTest<IsaCase>;

INSTANTIATE_TEST_SUITE_P(Isa, GemmIsa, ::testing::ValuesIn(all_cases()), case_name);

// The row counts of an expert: none, one, around a 16-row tile, and many.
const int64_t kRows[] = {0, 1, 15, 16, 17, 31, 33, 130};

std::string where(Op op, int64_t M, int64_t N, int64_t K, const std::string& more = "") {
  return std::string(op_name(op)) + " M" + std::to_string(M) + " N" + std::to_string(N) + " K" +
         std::to_string(K) + more;
}

TEST_P(GemmIsa, MatchesRefForEveryRowCount) {
  const auto [isa, in, out_dt] = GetParam();
  Rng rng(21);
  // K = 70 is not a multiple of any k step; N = 40 of no panel width.
  const int64_t N = 40, K = 70;
  for (int64_t M : kRows) {
    for (Op op : {Op::forward, Op::dx, Op::dw}) {
      for (bool accumulate : {false, true}) {
        const std::string name = where(op, M, N, K, accumulate ? " accumulate" : "");
        Operands s = operands(op, M, N, K);
        Tensor a = random_tensor(s.a, in, rng), b = random_tensor(s.b, in, rng);
        Tensor old = random_tensor(s.out, out_dt, rng);
        Tensor got = old.clone(), want = old.clone();
        run(op, /*cpu=*/true, got, a, b, accumulate);
        run(op, /*cpu=*/false, want, a, b, accumulate);
        Tensor absdot = Tensor::empty(s.out, DType::f64);
        run(op, /*cpu=*/false, absdot, abs_f64(a), abs_f64(b), false);
        EXPECT_TRUE(within_summation_bound(got, want, absdot, accumulate ? old : Tensor(),
                                           s.reduction, DType::f32, name));
      }
    }
  }
}

// Row i of forward and dx is bitwise the same computed with any other rows:
// each range below alone equals those rows of the 130-row product.
TEST_P(GemmIsa, ForwardAndDxRowsIndependentOfRowCount) {
  const auto [isa, in, out_dt] = GetParam();
  Rng rng(23);
  const int64_t all = 130;
  std::vector<std::pair<int64_t, int64_t>> weights = {{40, 70}, {100, 300}};
  if (!cpu_isa_emulated(isa)) weights.push_back({1536, 2048});  // Qwen3-30B-A3B's W13
  for (auto [N, K] : weights) {
    for (Op op : {Op::forward, Op::dx}) {
      Operands s = operands(op, all, N, K);
      Tensor a = random_tensor(s.a, in, rng), b = random_tensor(s.b, in, rng);
      Tensor whole = Tensor::empty(s.out, out_dt);
      run(op, true, whole, a, b, false);
      for (int64_t M : kRows) {
        for (int64_t begin : {int64_t{0}, int64_t{5}, all - M}) {
          if (M == 0 || begin + M > all) continue;
          Tensor part = Tensor::empty({M, s.out[1]}, out_dt);
          run(op, true, part, a.rows(begin, begin + M), b, false);
          EXPECT_TRUE(bitwise_equal(part, whole.rows(begin, begin + M),
                                    where(op, M, N, K, " from row " + std::to_string(begin))));
        }
      }
    }
  }
}

// A task of the driver is a block of rows times a run of column blocks whose
// A is packed once for all of them, or, past kKeepACap of packed A (a long
// K), once per column block; the run's length follows the thread count.
// Neither may change a bit: 1, 2 and 3 threads give three splits of these
// products, the long K takes the fallback.
TEST_P(GemmIsa, ThreadsAndColumnRunsChangeNothing) {
  const auto [isa, in, out_dt] = GetParam();
  if (cpu_isa_emulated(isa)) GTEST_SKIP() << "the long K is too slow on an emulation";
  Rng rng(31);
  const int saved = num_threads();
  const int64_t M = 100, N = 600;
  for (int64_t K : {int64_t{300}, int64_t{6000}}) {
    Operands s = operands(Op::forward, M, N, K);
    Tensor a = random_tensor(s.a, in, rng), b = random_tensor(s.b, in, rng);
    Tensor want = Tensor::empty(s.out, out_dt), absdot = Tensor::empty(s.out, DType::f64);
    run(Op::forward, /*cpu=*/false, want, a, b, false);
    run(Op::forward, /*cpu=*/false, absdot, abs_f64(a), abs_f64(b), false);
    Tensor first;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      Tensor got = Tensor::empty(s.out, out_dt);
      run(Op::forward, /*cpu=*/true, got, a, b, false);
      const std::string name = where(Op::forward, M, N, K, " threads " + std::to_string(threads));
      EXPECT_TRUE(
          within_summation_bound(got, want, absdot, Tensor(), s.reduction, DType::f32, name));
      if (!first.defined()) first = got;
      EXPECT_TRUE(bitwise_equal(got, first, name));
    }
  }
  set_num_threads(saved);
}

// dw sums over rows: zero rows appended (an expert's rows padded to a
// bucket) leave it bitwise unchanged, across kc blocks too (300 -> 512).
TEST_P(GemmIsa, DwUnchangedByZeroRows) {
  const auto [isa, in, out_dt] = GetParam();
  Rng rng(29);
  const int64_t pads[][2] = {{1, 16}, {15, 16}, {16, 32}, {17, 32}, {31, 64}, {33, 64}, {300, 512}};
  std::vector<std::pair<int64_t, int64_t>> weights = {{40, 70}};
  if (!cpu_isa_emulated(isa)) weights.push_back({2048, 768});  // Qwen3-30B-A3B's W2
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
                                where(Op::dw, M, N, K, " padded to " + std::to_string(bucket))));
    }
  }
}

// The work split changes with the thread count, the sums must not.
TEST_P(GemmIsa, ResultsIndependentOfThreadCount) {
  const auto [isa, in, out_dt] = GetParam();
  Rng rng(31);
  const int64_t M = 130, N = 300, K = 70;
  for (Op op : {Op::forward, Op::dx, Op::dw}) {
    Operands s = operands(op, M, N, K);
    Tensor a = random_tensor(s.a, in, rng), b = random_tensor(s.b, in, rng);
    Tensor one = Tensor::empty(s.out, out_dt), many = Tensor::empty(s.out, out_dt);
    set_num_threads(1);
    run(op, true, one, a, b, false);
    set_num_threads(3);
    run(op, true, many, a, b, false);
    set_num_threads(0);
    EXPECT_TRUE(bitwise_equal(many, one, where(op, M, N, K)));
  }
}

// avx2, avx512 and avx512-emu run the same FMA chains: the same bits for f32
// and for bf16 (widened exactly); avx512bf16 and amx run the avx512 kernel
// for f32. A wrong lane, column split or padding in one of them shows here.
TEST(CpuIsa, FmaIsasGiveTheSameBits) {
  Rng rng(37);
  const int64_t M = 33, N = 70, K = 45;
  for (auto [in, out_dt] :
       {std::pair{DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::bf16, DType::f32}}) {
    for (Op op : {Op::forward, Op::dx, Op::dw}) {
      Operands s = operands(op, M, N, K);
      Tensor a = random_tensor(s.a, in, rng), b = random_tensor(s.b, in, rng);
      Tensor want = Tensor::empty(s.out, out_dt);
      {
        ScopedIsa isa(CpuIsa::avx2);
        run(op, true, want, a, b, false);
      }
      std::vector<CpuIsa> same = {CpuIsa::avx512, CpuIsa::avx512_emu};
      if (in == DType::f32) {
        for (CpuIsa i :
             {CpuIsa::avx512bf16, CpuIsa::amx, CpuIsa::avx512bf16_emu, CpuIsa::amx_emu}) {
          same.push_back(i);
        }
      }
      for (CpuIsa i : same) {
        if (!cpu_isa_supported(i)) continue;  // named by GemmIsa's skips
        Tensor got = Tensor::empty(s.out, out_dt);
        ScopedIsa isa(i);
        run(op, true, got, a, b, false);
        EXPECT_TRUE(bitwise_equal(got, want,
                                  detail::str_of(cpu_isa_name(i), " vs avx2 ", dtype_name(in), " ",
                                                 where(op, M, N, K))));
      }
    }
  }
}

// The emulated bf16 instructions follow the SDM's pseudo-code, seen through
// one 1 x 1 product over K = 4 (x . w with x = 1 everywhere):
//   w = [0, 2^-24, 2^-24, 1]
//   in k order (avx2, fma chains):       ((0 + 2^-24) + 2^-24) + 1 = 1 + 2^-23
//   VDPBF16PS, odd then even per pair:   (0 + 2^-24) + 0 = 2^-24; + 1 = 1 (tie to
//                                        even); + 2^-24 = 1
//   TDPBF16PS, even and odd apart:       even 0 + 2^-24 = 2^-24, odd 2^-24 + 1 = 1;
//                                        1 + 2^-24 = 1
// and a denormal weight (bf16 0x0001) counts as zero there (DAZ), not in
// the FMA chains. Only the emulations are checked: nothing in TierMoE relies
// on these bits, only on each row getting the same ones.
TEST(CpuIsa, EmulatedBf16InstructionsFollowTheSdm) {
  auto product = [](CpuIsa isa, std::vector<uint16_t> w_bits) {
    Tensor x = Tensor::empty({1, int64_t(w_bits.size())}, DType::bf16);
    Tensor w = Tensor::empty({1, int64_t(w_bits.size())}, DType::bf16);
    for (size_t k = 0; k < w_bits.size(); ++k) {
      x.data<bf16>()[k] = float_to_bf16(1.0f);
      w.data<bf16>()[k] = bf16{w_bits[k]};
    }
    Tensor y = Tensor::empty({1, 1}, DType::f32);
    ScopedIsa scoped(isa);
    cpu::matmul_forward(y, x, w);
    return y.data<float>()[0];
  };
  const uint16_t zero = 0, tiny = float_to_bf16(0x1p-24f).bits, one = float_to_bf16(1.0f).bits;
  const std::vector<uint16_t> order = {zero, tiny, tiny, one};
  EXPECT_EQ(product(CpuIsa::avx2, order), 1.0f + 0x1p-23f);
  EXPECT_EQ(product(CpuIsa::avx512_emu, order), 1.0f + 0x1p-23f);
  EXPECT_EQ(product(CpuIsa::avx512bf16_emu, order), 1.0f);
  EXPECT_EQ(product(CpuIsa::amx_emu, order), 1.0f);
  const std::vector<uint16_t> denormal = {uint16_t(0x0001), zero};
  const float smallest = std::bit_cast<float>(uint32_t(1) << 16);
  EXPECT_EQ(product(CpuIsa::avx2, denormal), smallest);
  EXPECT_EQ(product(CpuIsa::avx512bf16_emu, denormal), 0.0f);
  EXPECT_EQ(product(CpuIsa::amx_emu, denormal), 0.0f);
}

TEST(CpuIsa, NamesRoundTripAndUnknownOnesAreClearErrors) {
  for (CpuIsa isa : kIsas) EXPECT_EQ(parse_cpu_isa(cpu_isa_name(isa)), isa);
  EXPECT_EQ(parse_cpu_isa("onednn"), CpuIsa::onednn);
  try {
    parse_cpu_isa("sse2");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sse2"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("amx-emu"), std::string::npos) << e.hint();
  }
  EXPECT_TRUE(cpu_isa_supported(cpu_isa()));
  // The emulated ISAs run anywhere; a hardware one the CPU lacks is refused
  // with the reason.
  for (CpuIsa isa : kIsas) {
    if (cpu_isa_emulated(isa)) {
      EXPECT_TRUE(cpu_isa_supported(isa));
    }
    if (cpu_isa_supported(isa)) continue;
    try {
      set_cpu_isa(isa);
      FAIL() << "set_cpu_isa accepted " << cpu_isa_name(isa);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cpu_isa_missing(isa)), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tiermoe
