// Attention over packed documents (kernels/attention.h, the doc_start_BT
// option): a packed row equals each document run as its own sequence, cpu::
// matches ref::, the backward matches f64 finite differences, attention
// across a boundary is caught, and a malformed layout is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/testing.h"
#include "tiermoe/kernels/attention.h"

namespace tiermoe {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::random_tensor;

constexpr int64_t B = 2, T = 19, Hq = 4, Hkv = 2, P = 8;

// Row 0: documents of 5, 9 and 5 tokens; row 1: 7, 1 and 11 (a document of
// one token sees only itself).
std::vector<int32_t> doc_starts() {
  std::vector<int32_t> s;
  for (const std::vector<int>& lens : {std::vector<int>{5, 9, 5}, std::vector<int>{7, 1, 11}}) {
    int start = 0;
    for (int len : lens) {
      for (int i = 0; i < len; ++i) s.push_back(start);
      start += len;
    }
  }
  return s;
}

struct DocsRun {
  Tensor out, lse, dq, dk, dv;
};

DocsRun run(bool cpu_kernels, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
            std::span<const int32_t> starts) {
  const DType dt = q.dtype(), acc = dt == DType::f64 ? DType::f64 : DType::f32;
  const int64_t b = q.size(0), t = q.size(1);
  DocsRun r{Tensor::empty(q.shape(), dt), Tensor::empty({b, t, q.size(2)}, acc),
            Tensor::empty(q.shape(), dt), Tensor::empty(k.shape(), dt),
            Tensor::empty(v.shape(), dt)};
  auto fwd = cpu_kernels ? cpu::attention_forward : ref::attention_forward;
  auto bwd = cpu_kernels ? cpu::attention_backward : ref::attention_backward;
  const AttentionOptions opt{.doc_start_BT = starts};
  fwd(r.out, r.lse, q, k, v, opt);
  bwd(r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, opt, false, nullptr);
  return r;
}

// Tokens [t0, t1) of row b as a [1, t1 - t0, H, P] tensor.
Tensor slice(const Tensor& x, int64_t b, int64_t t0, int64_t t1) {
  const int64_t H = x.size(2);
  Tensor out = Tensor::empty({1, t1 - t0, H, P}, x.dtype());
  out.copy_from(
      x.view({x.size(0) * x.size(1), H * P}).rows(b * x.size(1) + t0, b * x.size(1) + t1));
  return out;
}

TEST(AttentionDocs, APackedRowEqualsEachDocumentAlone) {
  const std::vector<int32_t> starts = doc_starts();
  for (DType dt : {DType::f64, DType::f32}) {
    for (bool cpu_kernels : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (cpu_kernels ? " cpu" : " ref"));
      Rng rng(11);
      Tensor q = random_tensor({B, T, Hq, P}, dt, rng), k = random_tensor({B, T, Hkv, P}, dt, rng);
      Tensor v = random_tensor({B, T, Hkv, P}, dt, rng), dout = random_tensor(q.shape(), dt, rng);
      const DocsRun packed = run(cpu_kernels, q, k, v, dout, starts);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t0 = 0; t0 < T;) {
          int64_t t1 = t0 + 1;
          while (t1 < T && starts[size_t(b * T + t1)] == t0) ++t1;
          SCOPED_TRACE("row " + std::to_string(b) + " document [" + std::to_string(t0) + ", " +
                       std::to_string(t1) + ")");
          const DocsRun alone = run(cpu_kernels, slice(q, b, t0, t1), slice(k, b, t0, t1),
                                    slice(v, b, t0, t1), slice(dout, b, t0, t1), {});
          // f64 and ref: the same sums in the same order, bitwise. The f32
          // flash kernel's key blocks start at multiples of its block in
          // the row, not at the document, so its online softmax rescales at
          // other keys: ulps.
          const bool bitwise = dt == DType::f64 || !cpu_kernels;
          const double rtol = bitwise ? 0 : 1e-5, atol = bitwise ? 0 : 1e-6;
          EXPECT_TRUE(all_close(slice(packed.out, b, t0, t1), alone.out, rtol, atol, "out"));
          EXPECT_TRUE(all_close(slice(packed.dq, b, t0, t1), alone.dq, rtol, atol, "dq"));
          EXPECT_TRUE(all_close(slice(packed.dk, b, t0, t1), alone.dk, rtol, atol, "dk"));
          EXPECT_TRUE(all_close(slice(packed.dv, b, t0, t1), alone.dv, rtol, atol, "dv"));
          t0 = t1;
        }
      }
    }
  }
}

TEST(AttentionDocs, CpuMatchesRef) {
  const std::vector<int32_t> starts = doc_starts();
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Rng rng(12);
    Tensor q = random_tensor({B, T, Hq, P}, dt, rng), k = random_tensor({B, T, Hkv, P}, dt, rng);
    Tensor v = random_tensor({B, T, Hkv, P}, dt, rng), dout = random_tensor(q.shape(), dt, rng);
    const DocsRun c = run(true, q, k, v, dout, starts), r = run(false, q, k, v, dout, starts);
    const double rtol = dt == DType::f64 ? 1e-11 : 1e-5, atol = dt == DType::f64 ? 1e-12 : 1e-6;
    if (dt == DType::f64) {
      EXPECT_TRUE(bitwise_equal(c.out, r.out, "out"));  // the row path sums as ref:: does
    } else {
      EXPECT_TRUE(all_close(c.out, r.out, rtol, atol, "out"));
    }
    EXPECT_TRUE(all_close(c.dq, r.dq, rtol, atol, "dq"));
    EXPECT_TRUE(all_close(c.dk, r.dk, rtol, atol, "dk"));
    EXPECT_TRUE(all_close(c.dv, r.dv, rtol, atol, "dv"));
  }
}

// At a real model's sizes (Qwen3-30B-A3B's heads, a packed SFT row of 768
// tokens in documents that straddle the kernel's key and query blocks) in
// bf16 and f32, on the machine's ISA: cpu:: within bf16's rounding of ref::.
TEST(AttentionDocs, ALongPackedRowAtModelSizesMatchesRef) {
  constexpr int64_t kT = 768, kHq = 32, kHkv = 4, kP = 128;
  std::vector<int32_t> starts;
  int start = 0;
  for (int len : {250, 401, 1, 116}) {
    for (int i = 0; i < len; ++i) starts.push_back(start);
    start += len;
  }
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Rng rng(16);
    const Tensor q = random_tensor({1, kT, kHq, kP}, dt, rng),
                 k = random_tensor({1, kT, kHkv, kP}, dt, rng);
    const Tensor v = random_tensor({1, kT, kHkv, kP}, dt, rng),
                 dout = random_tensor(q.shape(), dt, rng);
    const DocsRun c = run(true, q, k, v, dout, starts), r = run(false, q, k, v, dout, starts);
    const double tol = dt == DType::bf16 ? 3e-2 : 1e-4;
    EXPECT_TRUE(all_close(c.out, r.out, tol, tol, "out"));
    EXPECT_TRUE(all_close(c.dq, r.dq, tol, tol, "dq"));
    EXPECT_TRUE(all_close(c.dk, r.dk, tol, tol, "dk"));
    EXPECT_TRUE(all_close(c.dv, r.dv, tol, tol, "dv"));
  }
}

TEST(AttentionDocs, BackwardMatchesFiniteDifferences) {
  const std::vector<int32_t> starts = doc_starts();
  for (bool cpu_kernels : {true, false}) {
    SCOPED_TRACE(cpu_kernels ? "cpu" : "ref");
    Rng rng(13);
    Tensor q = random_tensor({B, T, Hq, P}, DType::f64, rng);
    Tensor k = random_tensor({B, T, Hkv, P}, DType::f64, rng);
    Tensor v = random_tensor({B, T, Hkv, P}, DType::f64, rng);
    Tensor r = random_tensor(q.shape(), DType::f64, rng);
    const DocsRun g = run(cpu_kernels, q, k, v, r, starts);
    auto loss = [&] {
      DocsRun f = run(cpu_kernels, q, k, v, r, starts);
      double s = 0;
      for (int64_t i = 0; i < f.out.numel(); ++i) s += f.out.get(i) * r.get(i);
      return s;
    };
    EXPECT_TRUE(testing::fd_check(loss, q, g.dq, "dq", 1e-6, 1e-8, 48));
    EXPECT_TRUE(testing::fd_check(loss, k, g.dk, "dk", 1e-6, 1e-8, 48));
    EXPECT_TRUE(testing::fd_check(loss, v, g.dv, "dv", 1e-6, 1e-8, 48));
  }
}

// Attention across a boundary would be caught: plain causal attention over the
// packed row changes every document after the first.
TEST(AttentionDocs, DroppingTheLayoutChangesLaterDocuments) {
  const std::vector<int32_t> starts = doc_starts();
  Rng rng(14);
  Tensor q = random_tensor({B, T, Hq, P}, DType::f64, rng);
  Tensor k = random_tensor({B, T, Hkv, P}, DType::f64, rng);
  Tensor v = random_tensor({B, T, Hkv, P}, DType::f64, rng);
  Tensor dout = random_tensor(q.shape(), DType::f64, rng);
  const DocsRun docs = run(true, q, k, v, dout, starts), causal = run(true, q, k, v, dout, {});
  EXPECT_TRUE(bitwise_equal(slice(docs.out, 0, 0, 5), slice(causal.out, 0, 0, 5), "first doc"));
  EXPECT_FALSE(all_close(slice(docs.out, 0, 5, 14), slice(causal.out, 0, 5, 14), 1e-3, 1e-3));
}

TEST(AttentionDocs, RejectsAMalformedLayout) {
  Rng rng(15);
  Tensor q = random_tensor({1, 4, 2, P}, DType::f64, rng),
         k = random_tensor({1, 4, 1, P}, DType::f64, rng);
  Tensor v = random_tensor({1, 4, 1, P}, DType::f64, rng);
  Tensor out = Tensor::empty(q.shape(), DType::f64), lse = Tensor::empty({1, 4, 2}, DType::f64);
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{0, 0, 1, 1}, std::vector<int32_t>{1, 1, 1, 1},
        std::vector<int32_t>{0, 0, 2, 0}, std::vector<int32_t>{0, 0, 0}}) {
    EXPECT_THROW(cpu::attention_forward(out, lse, q, k, v, {.doc_start_BT = bad}), Error);
    EXPECT_THROW(ref::attention_forward(out, lse, q, k, v, {.doc_start_BT = bad}), Error);
  }
  const std::vector<int32_t> good{0, 0, 2, 2};
  EXPECT_NO_THROW(cpu::attention_forward(out, lse, q, k, v, {.doc_start_BT = good}));
}

}  // namespace
}  // namespace tiermoe
