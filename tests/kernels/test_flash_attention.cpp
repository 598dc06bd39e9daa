// The flash attention of f32 and bf16 runs (src/kernels/cpu/attention.cpp)
// against ref:: (kernels/attention.h): causal and packed documents, GQA
// ratios 1 to 8, sequence lengths around its key block (1, 15, 17, 127, 130,
// 200), forward and backward, on this machine's ISA and on the emulated ones;
// the thread count changes no bit; the tolerances are shown to catch a
// kernel that drops or shifts keys. ref:: itself is held to f64 finite
// differences in test_attention.cpp and test_attention_docs.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/testing.h"
#include "isa_test_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/attention.h"

namespace tiermoe {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::random_tensor;

struct Shape4 {
  int64_t B, T, Hq, Hkv, P;
};

// Document lengths per row (empty: plain causal), cycled until T is full.
std::vector<int32_t> doc_starts(const Shape4& d, const std::vector<int>& lens) {
  if (lens.empty()) return {};
  std::vector<int32_t> s;
  for (int64_t b = 0; b < d.B; ++b) {
    int64_t start = 0, n = 0;
    for (size_t i = 0; start < d.T; ++i) {
      const int64_t len = lens[(i + size_t(b)) % lens.size()];
      for (int64_t t = start; t < std::min(d.T, start + len); ++t, ++n) s.push_back(int32_t(start));
      start += len;
    }
  }
  return s;
}

struct Result {
  Tensor out, lse, dq, dk, dv;
};

struct Problem {
  Shape4 d;
  DType dt;
  Tensor q, k, v, dout;
  std::vector<int32_t> starts;

  Problem(const Shape4& shape, DType dtype, const std::vector<int>& lens, uint64_t seed)
      : d(shape), dt(dtype), starts(doc_starts(shape, lens)) {
    Rng rng(seed);
    q = random_tensor({d.B, d.T, d.Hq, d.P}, dt, rng);
    k = random_tensor({d.B, d.T, d.Hkv, d.P}, dt, rng);
    v = random_tensor({d.B, d.T, d.Hkv, d.P}, dt, rng);
    dout = random_tensor(q.shape(), dt, rng);
  }

  // Forward and backward through cpu:: or ref::, with k replaced by `keys`
  // when given (a broken kernel's view of them).
  Result run(bool cpu_kernels, const Tensor* keys = nullptr) const {
    const Tensor& kk = keys ? *keys : k;
    const DType acc = dt == DType::f64 ? DType::f64 : DType::f32;
    Result r{Tensor::empty(q.shape(), dt), Tensor::empty({d.B, d.T, d.Hq}, acc),
             Tensor::empty(q.shape(), dt), Tensor::empty(k.shape(), dt),
             Tensor::empty(v.shape(), dt)};
    auto fwd = cpu_kernels ? cpu::attention_forward : ref::attention_forward;
    auto bwd = cpu_kernels ? cpu::attention_backward : ref::attention_backward;
    const AttentionOptions opt{.doc_start_BT = starts};
    fwd(r.out, r.lse, q, kk, v, opt);
    bwd(r.dq, r.dk, r.dv, dout, q, kk, v, r.out, r.lse, opt, false, nullptr);
    return r;
  }
};

// cpu:: against ref:: in the same dtype; see test_attention.cpp for why
// these bounds (the bf16 ones come from scores rounded to bf16, as HF does).
::testing::AssertionResult matches(const Result& got, const Result& want, DType dt) {
  const bool bf = dt == DType::bf16;
  const double o_rtol = bf ? 1.0 / 32 : 1e-5, o_atol = bf ? 1.0 / 64 : 1e-6;
  const double g_rtol = bf ? 1.0 / 32 : 1e-4, g_atol = bf ? 1.0 / 32 : 1e-5;
  for (auto [g, w, name, rtol, atol] : {std::tuple{&got.out, &want.out, "out", o_rtol, o_atol},
                                        {&got.lse, &want.lse, "lse", o_rtol, o_atol},
                                        {&got.dq, &want.dq, "dq", g_rtol, g_atol},
                                        {&got.dk, &want.dk, "dk", g_rtol, g_atol},
                                        {&got.dv, &want.dv, "dv", g_rtol, g_atol}}) {
    auto r = all_close(*g, *w, rtol, atol, name);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

struct Case {
  Shape4 d;
  std::vector<int> lens;
};

std::string describe(const Case& c, DType dt) {
  std::string s = std::string(dtype_name(dt)) + " B " + std::to_string(c.d.B) + " T " +
                  std::to_string(c.d.T) + " Hq " + std::to_string(c.d.Hq) + " Hkv " +
                  std::to_string(c.d.Hkv) + " P " + std::to_string(c.d.P);
  if (!c.lens.empty()) s += " packed";
  return s;
}

// Lengths around the 64-row key block; GQA groups of 1, 2, 3, 4 and 8;
// documents that cross block boundaries, and one-token documents.
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{1, 1, 2, 1, 8}, {}},
      {{2, 15, 4, 4, 7}, {}},
      {{1, 17, 8, 1, 64}, {}},
      {{1, 127, 4, 2, 64}, {}},
      {{2, 130, 6, 2, 128}, {}},
      {{1, 130, 8, 2, 32}, {1, 63, 3, 70}},
      {{2, 200, 4, 1, 16}, {40, 1, 90, 65}},
      {{1, 17, 4, 2, 130}, {5, 1, 11}},
  };
  return all;
}

TEST(FlashAttention, MatchesRef) {
  for (DType dt : {DType::f32, DType::bf16}) {
    uint64_t seed = 100;
    for (const Case& c : cases()) {
      SCOPED_TRACE(describe(c, dt));
      const Problem p(c.d, dt, c.lens, seed++);
      EXPECT_TRUE(matches(p.run(true), p.run(false), dt));
    }
  }
}

// What the tolerances catch: a kernel that skipped a key block, read keys
// one position late, or let a query see across its document boundary fails
// them. Each broken view is what ref:: computes on changed keys or layout.
TEST(FlashAttention, TolerancesCatchDroppedShiftedAndLeakedKeys) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Shape4 d{1, 150, 4, 2, 64};
    const Problem p(d, dt, {}, 7);
    const Result cpu = p.run(true);
    ASSERT_TRUE(matches(cpu, p.run(false), dt));
    const int64_t row = d.Hkv * d.P;
    Tensor dropped = p.k.clone(), shifted = p.k.clone();
    for (int64_t i = 64 * row; i < 128 * row; ++i) dropped.set(i, -30.0);  // block 1 unseen
    for (int64_t t = d.T - 1; t > 0; --t) {
      for (int64_t c = 0; c < row; ++c) shifted.set(t * row + c, p.k.get((t - 1) * row + c));
    }
    EXPECT_FALSE(matches(cpu, p.run(false, &dropped), dt)) << "a dropped key block";
    EXPECT_FALSE(matches(cpu, p.run(false, &shifted), dt)) << "keys shifted by one";
    Problem leaky(d, dt, {70, 80}, 7);  // the same tensors, two documents
    EXPECT_FALSE(matches(cpu, leaky.run(false), dt)) << "attention across a document boundary";
  }
}

// The kernel's tiles are the microkernel's: every ISA's (the emulations
// included) gives results within the same bounds. AMX and AVX-512 BF16 read
// P and dS as bf16, inside the bf16 bounds; their f32 runs use the FMA kernels.
struct IsaCase {
  CpuIsa isa;
};
class FlashAttentionIsa : public testing::IsaTest<IsaCase> {};

TEST_P(FlashAttentionIsa, MatchesRef) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : {Case{{1, 70, 4, 2, 32}, {}}, Case{{1, 70, 2, 1, 16}, {3, 66}}}) {
      SCOPED_TRACE(describe(c, dt));
      const Problem p(c.d, dt, c.lens, 21);
      EXPECT_TRUE(matches(p.run(true), p.run(false), dt));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, FlashAttentionIsa,
                         ::testing::Values(IsaCase{CpuIsa::avx2}, IsaCase{CpuIsa::avx512},
                                           IsaCase{CpuIsa::avx512bf16}, IsaCase{CpuIsa::amx},
                                           IsaCase{CpuIsa::avx512_emu},
                                           IsaCase{CpuIsa::avx512bf16_emu},
                                           IsaCase{CpuIsa::amx_emu}),
                         [](const auto& info) {
                           std::string n(cpu_isa_name(info.param.isa));
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

// Every output element is written by one task, partial sums added in head
// order: 1, 2 and 3 threads give the same bits, causal and packed.
TEST(FlashAttention, ThreadCountChangesNoBit) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const std::vector<int>& lens : {std::vector<int>{}, std::vector<int>{50, 1, 120}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (lens.empty() ? " causal" : " packed"));
      const Problem p({2, 190, 8, 2, 64}, dt, lens, 31);
      std::vector<Result> runs;
      for (int threads : {1, 2, 3}) {
        set_num_threads(threads);
        runs.push_back(p.run(true));
      }
      set_num_threads(0);
      for (size_t i = 1; i < runs.size(); ++i) {
        EXPECT_TRUE(bitwise_equal(runs[i].out, runs[0].out, "out"));
        EXPECT_TRUE(bitwise_equal(runs[i].lse, runs[0].lse, "lse"));
        EXPECT_TRUE(bitwise_equal(runs[i].dq, runs[0].dq, "dq"));
        EXPECT_TRUE(bitwise_equal(runs[i].dk, runs[0].dk, "dk"));
        EXPECT_TRUE(bitwise_equal(runs[i].dv, runs[0].dv, "dv"));
      }
    }
  }
}

// A query's result depends on its own keys only: appending tokens to a row
// (a longer T) leaves every earlier row's output and lse bitwise unchanged.
TEST(FlashAttention, LaterTokensChangeNoEarlierBit) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Problem longer({1, 190, 4, 2, 64}, dt, {}, 41);
    Problem shorter({1, 100, 4, 2, 64}, dt, {}, 41);
    auto head = [](const Tensor& x, int64_t rows) {
      return x.view({x.size(1), x.numel() / x.size(1)}).rows(0, rows).clone();
    };
    shorter.q = head(longer.q, 100).view(shorter.q.shape());
    shorter.k = head(longer.k, 100).view(shorter.k.shape());
    shorter.v = head(longer.v, 100).view(shorter.v.shape());
    const Result a = longer.run(true), b = shorter.run(true);
    EXPECT_TRUE(bitwise_equal(head(a.out, 100).view(b.out.shape()), b.out, "out"));
    EXPECT_TRUE(bitwise_equal(head(a.lse, 100).view(b.lse.shape()), b.lse, "lse"));
  }
}

// A NaN in a query reaches that query's output (the model's non-finite
// guards look there), and no other query's.
TEST(FlashAttention, ANanQueryReachesItsOutput) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Problem p({1, 100, 2, 1, 16}, dt, {}, 51);
    const int64_t at = (70 * 2 + 1) * 16 + 3;  // token 70, head 1
    p.q.set(at, std::nan(""));
    const Result r = p.run(true);
    int64_t nan_rows = 0;
    for (int64_t row = 0; row < 100 * 2; ++row) {
      bool bad = false;
      for (int64_t c = 0; c < 16; ++c) bad |= std::isnan(r.out.get(row * 16 + c));
      nan_rows += bad;
      if (row == 70 * 2 + 1) {
        EXPECT_TRUE(bad) << "the NaN query's output";
      }
    }
    EXPECT_EQ(nan_rows, 1);
  }
}

}  // namespace
}  // namespace tiermoe
