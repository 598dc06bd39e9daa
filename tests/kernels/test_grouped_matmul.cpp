// The grouped products (kernels/grouped_matmul.h) on every ISA this machine
// can run: against the ref oracle for the row counts an expert sees, bitwise
// equal to the per-group cpu:: matmuls they replace, and every row's bits
// independent of the other rows and groups, the threads and warm-up. An ISA
// the machine lacks is skipped, and says why.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../../src/kernels/cpu/gemm/driver.h"
#include "common/testing.h"
#include "kernels/isa_test_util.h"
#include "kernels/matmul_test_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/activation.h"
#include "tiermoe/kernels/grouped_matmul.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe {
namespace {

using testing::abs_f64;
using testing::bitwise_equal;
using testing::random_tensor;
using testing::ScopedIsa;
using testing::within_summation_bound;

struct Case {
  CpuIsa isa;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string isa(cpu_isa_name(info.param.isa));
  for (char& c : isa) c = c == '-' ? '_' : c;
  return isa + "_" + std::string(dtype_name(info.param.dtype));
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16, CpuIsa::amx,
                     CpuIsa::avx512_emu, CpuIsa::avx512bf16_emu, CpuIsa::amx_emu}) {
    for (DType dt : {DType::f32, DType::bf16}) v.push_back({isa, dt});
  }
  return v;
}

// The rows per group an expert sees: none, one, around a 16-row tile and a
// 32-row block, and many (past one 96-row block of C).
const std::vector<int64_t> kRows = {0, 1, 15, 16, 17, 31, 33, 130};
// D = 70 is a multiple of no k step; F = 150 splits the swiglu layout into
// a full 128-column half block and a partial one.
constexpr int64_t kD = 70, kF = 150;

std::vector<int64_t> offsets(const std::vector<int64_t>& rows) {
  std::vector<int64_t> o{0};
  for (int64_t r : rows) o.push_back(o.back() + r);
  return o;
}

class GroupedIsa : public testing::IsaTest<Case> {
 protected:
  // The layer under test: G groups of W13 [2F, D] and W2 [D, F], biases,
  // scores, inputs for kRows rows per group.
  struct Layer {
    Tensor w13, w2, b13, b2, x, score, dy;
    std::vector<int64_t> offset;
    int64_t N = 0;
  };
  Layer layer(DType dt, uint64_t seed) {
    Rng rng(seed);
    Layer l;
    const int64_t G = int64_t(kRows.size());
    l.offset = offsets(kRows);
    l.N = l.offset.back();
    l.w13 = random_tensor({G, 2 * kF, kD}, dt, rng, 0.3);
    l.w2 = random_tensor({G, kD, kF}, dt, rng, 0.3);
    l.b13 = random_tensor({G, 2 * kF}, dt, rng, 0.5);
    l.b2 = random_tensor({G, kD}, dt, rng, 0.5);
    l.x = random_tensor({l.N, kD}, dt, rng);
    l.dy = random_tensor({l.N, kD}, dt, rng);
    l.score = Tensor::empty({l.N}, DType::f32);
    for (int64_t n = 0; n < l.N; ++n) l.score.set(n, rng.uniform(0.05, 1.0));
    return l;
  }
};

INSTANTIATE_TEST_SUITE_P(Isa, GroupedIsa, ::testing::ValuesIn(all_cases()), case_name);

// |got - want| within tol * (1 + |want|): the elementwise steps after a
// product that may differ from ref's by its summation bound (a wrong column,
// row or group is off by O(1)).
::testing::AssertionResult close(const Tensor& got, const Tensor& want, double tol,
                                 const std::string& name) {
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (!(std::abs(g - w) <= tol * (1 + std::abs(w)))) {
      return ::testing::AssertionFailure() << name << " at flat " << i << ": cpu " << g
                                           << ", ref " << w;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST_P(GroupedIsa, MatchesRefForEveryRowCount) {
  const DType dt = GetParam().dtype;
  Layer l = layer(dt, 41);
  const int64_t N = l.N;
  const double tol = dt == DType::bf16 ? 0x1p-5 : 1e-4;
  for (Glu glu : {Glu{GluKind::swiglu}, Glu{GluKind::clamped, 1.702, 7.0}}) {
    const std::string kind = glu.kind == GluKind::swiglu ? "swiglu" : "clamped";
    PackedWeights w13, w13_abs;
    w13.pack(l.w13, PackUse::forward_glu, glu);
    w13_abs.pack(abs_f64(l.w13).to(DType::f32), PackUse::forward_glu, glu);
    for (bool extras : {false, true}) {
      const Tensor b13 = extras ? l.b13 : Tensor(), score = extras ? l.score : Tensor();
      Tensor h[2], a[2], as[2];
      for (int i = 0; i < 2; ++i) {
        h[i] = Tensor::empty({N, 2 * kF}, dt);
        a[i] = Tensor::empty({N, kF}, dt);
        as[i] = Tensor::empty({N, kF}, dt);
      }
      cpu::grouped_glu_forward(h[0], a[0], as[0], l.x, l.offset, w13, b13, score);
      ref::grouped_glu_forward(h[1], a[1], as[1], l.x, l.offset, w13, b13, score);
      const std::string name = kind + (extras ? " bias+score" : "");
      if (!extras) {
        Tensor absdot = Tensor::empty({N, 2 * kF}, DType::f32);
        Tensor unused_a = Tensor::empty({N, kF}, DType::f32);
        ref::grouped_glu_forward(absdot, unused_a, unused_a, abs_f64(l.x).to(DType::f32), l.offset,
                                 w13_abs, Tensor(), Tensor());
        EXPECT_TRUE(within_summation_bound(h[0], h[1], absdot.to(DType::f64), Tensor(), kD,
                                           DType::f32, name + " h"));
      } else {
        EXPECT_TRUE(close(h[0], h[1], tol, name + " h"));
        EXPECT_TRUE(close(as[0], as[1], tol, name + " a*score"));
      }
      EXPECT_TRUE(close(a[0], a[1], tol, name + " a"));
    }
  }
  // W2 forward (bias scaled by the score) and both dx products.
  PackedWeights w2, w2_dx, w13_dx;
  w2.pack(l.w2, PackUse::forward);
  w2_dx.pack(l.w2, PackUse::backward_dx);
  w13_dx.pack(l.w13, PackUse::backward_dx);
  Rng rng(43);
  Tensor as = random_tensor({N, kF}, dt, rng), dh = random_tensor({N, 2 * kF}, dt, rng);
  struct Product {
    const char* name;
    const PackedWeights* w;
    Tensor in;
    int64_t out_cols;
    bool bias;
  };
  for (const Product& p : {Product{"w2 forward", &w2, as, kD, true},
                           Product{"w2 dx", &w2_dx, l.dy, kF, false},
                           Product{"w13 dx", &w13_dx, dh, kD, false}}) {
    Tensor got = Tensor::empty({N, p.out_cols}, dt), want = Tensor::empty({N, p.out_cols}, dt);
    cpu::grouped_matmul(got, p.in, l.offset, *p.w);
    ref::grouped_matmul(want, p.in, l.offset, *p.w);
    EXPECT_TRUE(close(got, want, tol, p.name));
    if (p.bias) {
      cpu::grouped_matmul(got, p.in, l.offset, *p.w, l.b2, l.score);
      ref::grouped_matmul(want, p.in, l.offset, *p.w, l.b2, l.score);
      EXPECT_TRUE(close(got, want, tol, std::string(p.name) + " bias*score"));
    }
  }
}

// The grouped products are the per-group cpu:: matmuls (weights packed on
// the fly there, ahead here) and the elementwise SwiGLU, bit for bit.
TEST_P(GroupedIsa, EqualsPerGroupMatmulsBitwise) {
  const DType dt = GetParam().dtype;
  Layer l = layer(dt, 53);
  const int64_t N = l.N, G = int64_t(kRows.size());
  PackedWeights w13, w2, w2_dx, w13_dx;
  w13.pack(l.w13, PackUse::forward_glu);
  w2.pack(l.w2, PackUse::forward);
  w2_dx.pack(l.w2, PackUse::backward_dx);
  w13_dx.pack(l.w13, PackUse::backward_dx);
  Tensor h = Tensor::empty({N, 2 * kF}, dt), a = Tensor::empty({N, kF}, dt), none;
  cpu::grouped_glu_forward(h, a, none, l.x, l.offset, w13, Tensor(), Tensor());
  Tensor y = Tensor::empty({N, kD}, dt), da = Tensor::empty({N, kF}, dt);
  Tensor dx = Tensor::empty({N, kD}, dt);
  cpu::grouped_matmul(y, a, l.offset, w2);
  cpu::grouped_matmul(da, l.dy, l.offset, w2_dx);
  cpu::grouped_matmul(dx, h, l.offset, w13_dx);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t b = l.offset[size_t(g)], e = l.offset[size_t(g) + 1];
    if (b == e) continue;
    const std::string at = " group " + std::to_string(g) + " (" + std::to_string(e - b) + " rows)";
    Tensor hg = Tensor::empty({e - b, 2 * kF}, dt), ag = Tensor::empty({e - b, kF}, dt);
    cpu::matmul_forward(hg, l.x.rows(b, e), l.w13.select(g));
    cpu::swiglu_forward(ag, hg);
    EXPECT_TRUE(bitwise_equal(h.rows(b, e), hg, "h" + at));
    EXPECT_TRUE(bitwise_equal(a.rows(b, e), ag, "a" + at));
    Tensor yg = Tensor::empty({e - b, kD}, dt), dag = Tensor::empty({e - b, kF}, dt);
    Tensor dxg = Tensor::empty({e - b, kD}, dt);
    cpu::matmul_forward(yg, a.rows(b, e), l.w2.select(g));
    cpu::matmul_backward_dx(dag, l.dy.rows(b, e), l.w2.select(g));
    cpu::matmul_backward_dx(dxg, h.rows(b, e), l.w13.select(g));
    EXPECT_TRUE(bitwise_equal(y.rows(b, e), yg, "y" + at));
    EXPECT_TRUE(bitwise_equal(da.rows(b, e), dag, "da" + at));
    EXPECT_TRUE(bitwise_equal(dx.rows(b, e), dxg, "dx" + at));
  }
}

// A row's bits depend on nothing but its row and its group's weight: each
// group's first r rows computed alone (every other group skipped, or with
// zero rows) equal those rows of the whole call, and zero rows appended to
// a group (padding) change none of its other rows.
TEST_P(GroupedIsa, RowsIndependentOfGroupSizesAndPadding) {
  const DType dt = GetParam().dtype;
  Layer l = layer(dt, 59);
  const int64_t N = l.N, G = int64_t(kRows.size());
  for (Glu glu : {Glu{GluKind::swiglu}, Glu{GluKind::clamped, 1.702, 7.0}}) {
    PackedWeights w13, w13_dx;
    w13.pack(l.w13, PackUse::forward_glu, glu);
    w13_dx.pack(l.w13, PackUse::backward_dx);
    Tensor h = Tensor::empty({N, 2 * kF}, dt), a = Tensor::empty({N, kF}, dt);
    Tensor as = Tensor::empty({N, kF}, dt), dx = Tensor::empty({N, kD}, dt);
    cpu::grouped_glu_forward(h, a, as, l.x, l.offset, w13, l.b13, l.score);
    cpu::grouped_matmul(dx, h, l.offset, w13_dx);
    for (int64_t g = 0; g < G; ++g) {
      const int64_t b = l.offset[size_t(g)], e = l.offset[size_t(g) + 1];
      for (int64_t r : {e - b, (e - b) / 2, int64_t{1}}) {
        if (r == 0 || r > e - b) continue;
        for (int64_t pad : {int64_t{0}, int64_t{7}}) {
          // Group g alone: its first r rows, then `pad` zero rows.
          std::vector<int64_t> rows(size_t(G), 0);
          rows[size_t(g)] = r + pad;
          const std::vector<int64_t> off = offsets(rows);
          Tensor x = Tensor::zeros({r + pad, kD}, dt), s = Tensor::zeros({r + pad}, DType::f32);
          x.rows(0, r).copy_from(l.x.rows(b, b + r));
          s.rows(0, r).copy_from(l.score.rows(b, b + r));
          Tensor hg = Tensor::empty({r + pad, 2 * kF}, dt), ag = Tensor::empty({r + pad, kF}, dt);
          Tensor asg = Tensor::empty({r + pad, kF}, dt), dxg = Tensor::empty({r + pad, kD}, dt);
          cpu::grouped_glu_forward(hg, ag, asg, x, off, w13, l.b13, s);
          cpu::grouped_matmul(dxg, hg, off, w13_dx);
          const std::string at = " group " + std::to_string(g) + " rows " + std::to_string(r) +
                                 " pad " + std::to_string(pad);
          EXPECT_TRUE(bitwise_equal(hg.rows(0, r), h.rows(b, b + r), "h" + at));
          EXPECT_TRUE(bitwise_equal(ag.rows(0, r), a.rows(b, b + r), "a" + at));
          EXPECT_TRUE(bitwise_equal(asg.rows(0, r), as.rows(b, b + r), "a*score" + at));
          EXPECT_TRUE(bitwise_equal(dxg.rows(0, r), dx.rows(b, b + r), "dx" + at));
        }
      }
    }
  }
}

// Skipped groups' rows are left as they were (another tier owns them); the
// others are what the whole call gives.
TEST_P(GroupedIsa, SkippedGroupsUntouched) {
  const DType dt = GetParam().dtype;
  Layer l = layer(dt, 61);
  const int64_t N = l.N, G = int64_t(kRows.size());
  PackedWeights w2;
  w2.pack(l.w2, PackUse::forward);
  Rng rng(67);
  Tensor a = random_tensor({N, kF}, dt, rng);
  Tensor all = Tensor::empty({N, kD}, dt);
  cpu::grouped_matmul(all, a, l.offset, w2, l.b2, l.score);
  std::vector<uint8_t> skip(size_t(G), 0);
  for (int64_t g = 0; g < G; g += 2) skip[size_t(g)] = 1;
  Tensor some = Tensor::empty({N, kD}, dt);
  some.fill(3.0);
  cpu::grouped_matmul(some, a, l.offset, w2, l.b2, l.score, skip);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t b = l.offset[size_t(g)], e = l.offset[size_t(g) + 1];
    if (b == e) continue;
    const std::string at = "group " + std::to_string(g);
    if (skip[size_t(g)]) {
      Tensor threes = Tensor::empty({e - b, kD}, dt);
      threes.fill(3.0);
      EXPECT_TRUE(bitwise_equal(some.rows(b, e), threes, at));
    } else {
      EXPECT_TRUE(bitwise_equal(some.rows(b, e), all.rows(b, e), at));
    }
  }
}

// The work items split differently over 1 and 3 threads; the bits do not
// change, and once warm no call grows the GEMM scratch.
TEST_P(GroupedIsa, ThreadCountAndWarmCallsChangeNothing) {
  const DType dt = GetParam().dtype;
  Layer l = layer(dt, 71);
  const int64_t N = l.N;
  PackedWeights w13;
  w13.pack(l.w13, PackUse::forward_glu);
  Tensor h[2], a[2], as[2];
  for (int t = 0; t < 2; ++t) {
    h[t] = Tensor::empty({N, 2 * kF}, dt);
    a[t] = Tensor::empty({N, kF}, dt);
    as[t] = Tensor::empty({N, kF}, dt);
    set_num_threads(t == 0 ? 1 : 3);
    cpu::grouped_glu_forward(h[t], a[t], as[t], l.x, l.offset, w13, l.b13, l.score);
  }
  set_num_threads(0);
  EXPECT_TRUE(bitwise_equal(h[1], h[0], "h"));
  EXPECT_TRUE(bitwise_equal(as[1], as[0], "a*score"));
  const int64_t before = cpu::gemm::scratch_growths();
  for (int i = 0; i < 3; ++i) {
    cpu::grouped_glu_forward(h[1], a[1], as[1], l.x, l.offset, w13, l.b13, l.score);
  }
  EXPECT_EQ(cpu::gemm::scratch_growths(), before);
}

TEST(GroupedMatmul, RejectsBadArguments) {
  Rng rng(73);
  Tensor w = random_tensor({2, 6, 4}, DType::f32, rng), x = random_tensor({5, 4}, DType::f32, rng);
  Tensor y = Tensor::empty({5, 6}, DType::f32);
  PackedWeights unpacked;
  EXPECT_THROW(cpu::grouped_matmul(y, x, {0, 2, 5}, unpacked), Error);
  PackedWeights p;
  EXPECT_THROW(p.pack(x, PackUse::forward), Error);  // not [G, N, K]
  // One weight per group: every one [N, K] at the products' width or
  // narrower (bf16 into f32), never wider.
  const Tensor w_bf16 = w.to(DType::bf16);
  EXPECT_THROW(p.pack({w.select(0), x}, DType::f32, PackUse::forward), Error);
  EXPECT_THROW(p.pack({w.select(0), w.select(1)}, DType::bf16, PackUse::forward), Error);
  EXPECT_THROW(p.pack({}, DType::f32, PackUse::forward), Error);
  EXPECT_THROW(p.pack(random_tensor({2, 5, 4}, DType::f32, rng), PackUse::forward_glu), Error)
      << "a GLU weight with an odd output count";
  p.pack({w.select(0), w_bf16.select(1)}, DType::f32, PackUse::forward);
  EXPECT_EQ(p.dtype(), DType::f32);
  p.pack(w, PackUse::forward);
  EXPECT_EQ(p.bytes() > 0, true);
  EXPECT_THROW(cpu::grouped_matmul(y, x, {0, 2, 4}, p), Error);     // offsets end short of N
  EXPECT_THROW(cpu::grouped_matmul(y, x, {0, 3, 2, 5}, p), Error);  // one offset too many
  Tensor y_bad = Tensor::empty({5, 5}, DType::f32);
  EXPECT_THROW(cpu::grouped_matmul(y_bad, x, {0, 2, 5}, p), Error);
  Tensor h = Tensor::empty({5, 6}, DType::f32), a = Tensor::empty({5, 3}, DType::f32);
  EXPECT_THROW(cpu::grouped_glu_forward(h, a, a, x, {0, 2, 5}, p, Tensor(), Tensor()), Error);
  try {
    ScopedIsa other(cpu_isa() == CpuIsa::avx512_emu ? CpuIsa::avx2 : CpuIsa::avx512_emu);
    cpu::grouped_matmul(y, x, {0, 2, 5}, p);
    ADD_FAILURE() << "weights packed for another ISA were accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("packed for"), std::string::npos) << e.message();
    EXPECT_NE(e.hint().find("re-pack"), std::string::npos) << e.hint();
  }
}

}  // namespace
}  // namespace tiermoe
