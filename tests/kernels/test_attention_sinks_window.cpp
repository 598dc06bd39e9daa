// gpt-oss's attention options (kernels/attention.h, "Options"): a learned
// sink logit per head and a sliding window, alone, together and with packed
// documents. ref:: is held to f64 finite differences (dsinks included) and to
// an identity that does not share its code (a sink rescales plain
// attention); cpu:: (the f64 row path, the flash kernel of f32 and bf16 on
// every ISA) is held to ref::, with the tolerances shown to catch a dropped
// sink and a window one key too wide; the thread count changes no bit.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
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
using testing::fd_check;
using testing::random_tensor;

struct Shape4 {
  int64_t B, T, Hq, Hkv, P;
};

DType acc_of(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

struct Result {
  Tensor out, lse, dq, dk, dv, dsinks;
};

// One problem: inputs, and the options' window, sinks (or none) and docs.
struct Problem {
  Shape4 d;
  DType dt;
  Tensor q, k, v, dout, sinks;
  int64_t window = 0;
  bool with_sinks = false;
  std::vector<int32_t> starts;

  Problem(const Shape4& shape, DType dtype, int64_t w, bool sinks_on, uint64_t seed,
          int64_t doc_len = 0)
      : d(shape), dt(dtype), window(w), with_sinks(sinks_on) {
    Rng rng(seed);
    q = random_tensor({d.B, d.T, d.Hq, d.P}, dt, rng);
    k = random_tensor({d.B, d.T, d.Hkv, d.P}, dt, rng);
    v = random_tensor({d.B, d.T, d.Hkv, d.P}, dt, rng);
    dout = random_tensor(q.shape(), dt, rng);
    // Sinks around the scores' size (some heads mostly sink, some barely).
    sinks = random_tensor({d.Hq}, dt, rng, 2.0);
    if (doc_len > 0) {
      for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t t = 0; t < d.T; ++t) starts.push_back(int32_t(t / doc_len * doc_len));
      }
    }
  }

  AttentionOptions options(const Tensor* sinks_override = nullptr) const {
    return {.doc_start_BT = starts,
            .window = window,
            .sinks_H = sinks_override ? sinks_override
                       : with_sinks   ? &sinks
                                      : nullptr};
  }

  Result run(bool cpu_kernels, std::optional<AttentionOptions> opt_override = {}) const {
    const AttentionOptions opt = opt_override ? *opt_override : options();
    Result r{Tensor::empty(q.shape(), dt), Tensor::empty({d.B, d.T, d.Hq}, acc_of(dt)),
             Tensor::empty(q.shape(), dt), Tensor::empty(k.shape(), dt),
             Tensor::empty(v.shape(), dt), Tensor::zeros({d.Hq}, acc_of(dt))};
    auto fwd = cpu_kernels ? cpu::attention_forward : ref::attention_forward;
    auto bwd = cpu_kernels ? cpu::attention_backward : ref::attention_backward;
    fwd(r.out, r.lse, q, k, v, opt);
    bwd(r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, opt, false,
        opt.sinks_H ? &r.dsinks : nullptr);
    return r;
  }
};

// cpu:: against ref:: in the same dtype, the bounds of test_flash_attention
// (f64: the row path's backward sums in another order). dsinks sums over
// B*T rows, so its absolute floor grows with them.
::testing::AssertionResult matches(const Result& got, const Result& want, DType dt) {
  const bool bf = dt == DType::bf16, f64 = dt == DType::f64;
  const double o_rtol = bf    ? 1.0 / 32
                        : f64 ? 1e-13
                              : 1e-5,
               o_atol = bf    ? 1.0 / 64
                        : f64 ? 1e-13
                              : 1e-6;
  const double g_rtol = bf    ? 1.0 / 32
                        : f64 ? 1e-11
                              : 1e-4,
               g_atol = bf    ? 1.0 / 32
                        : f64 ? 1e-11
                              : 1e-5;
  const double s_atol = g_atol * double(want.lse.numel()) / 8;
  for (auto [g, w, name, rtol, atol] : {std::tuple{&got.out, &want.out, "out", o_rtol, o_atol},
                                        {&got.lse, &want.lse, "lse", o_rtol, o_atol},
                                        {&got.dq, &want.dq, "dq", g_rtol, g_atol},
                                        {&got.dk, &want.dk, "dk", g_rtol, g_atol},
                                        {&got.dv, &want.dv, "dv", g_rtol, g_atol},
                                        {&got.dsinks, &want.dsinks, "dsinks", g_rtol, s_atol}}) {
    auto r = all_close(*g, *w, rtol, atol, name);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

struct Case {
  Shape4 d;
  int64_t window;
  bool sinks;
  int64_t doc_len;  // 0: one document per row
};

std::string describe(const Case& c, DType dt) {
  return std::string(dtype_name(dt)) + " T " + std::to_string(c.d.T) + " Hq " +
         std::to_string(c.d.Hq) + " Hkv " + std::to_string(c.d.Hkv) + " window " +
         std::to_string(c.window) + (c.sinks ? " sinks" : "") +
         (c.doc_len ? " docs of " + std::to_string(c.doc_len) : "");
}

// Windows of one key, inside a key block, across blocks and past T; with and
// without sinks and documents.
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{1, 9, 2, 1, 8}, 0, true, 0},       {{2, 20, 4, 2, 16}, 1, false, 0},
      {{1, 70, 4, 2, 32}, 5, true, 0},     {{1, 200, 4, 1, 16}, 64, true, 0},
      {{2, 150, 2, 2, 64}, 100, true, 30}, {{1, 130, 8, 2, 32}, 128, false, 50},
      {{1, 40, 2, 1, 8}, 500, true, 0},
  };
  return all;
}

TEST(AttentionSinksWindow, CpuMatchesRef) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    uint64_t seed = 300;
    for (const Case& c : cases()) {
      SCOPED_TRACE(describe(c, dt));
      const Problem p(c.d, dt, c.window, c.sinks, seed++, c.doc_len);
      const Result cpu = p.run(true), ref = p.run(false);
      EXPECT_TRUE(matches(cpu, ref, dt));
      // The f64 row path's forward is ref::'s, bit for bit.
      if (dt == DType::f64) EXPECT_TRUE(bitwise_equal(cpu.out, ref.out, "out"));
    }
  }
}

// The same bounds fail a kernel that forgot the sink, or saw one key too many.
TEST(AttentionSinksWindow, TolerancesCatchADroppedSinkAndAWiderWindow) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Problem p({1, 150, 4, 2, 64}, dt, 40, true, 9);
    const Result cpu = p.run(true);
    ASSERT_TRUE(matches(cpu, p.run(false), dt));
    AttentionOptions no_sink = p.options(), wider = p.options();
    no_sink.sinks_H = nullptr;
    wider.window = p.window + 1;
    Result dropped = p.run(false, no_sink);
    dropped.dsinks = cpu.dsinks.clone();  // compare the rest
    EXPECT_FALSE(matches(cpu, dropped, dt)) << "the sink dropped";
    EXPECT_FALSE(matches(cpu, p.run(false, wider), dt)) << "the window one key wider";
  }
}

// A sink is a softmax column with no value: against plain attention (same
// q, k, v, window) lse' = logaddexp(lse, sink) and out' = out exp(lse - lse').
TEST(AttentionSinksWindow, ASinkRescalesPlainAttention) {
  const Problem p({2, 33, 4, 2, 8}, DType::f64, 7, true, 5);
  for (bool cpu_kernels : {false, true}) {
    SCOPED_TRACE(cpu_kernels ? "cpu" : "ref");
    AttentionOptions plain = p.options();
    plain.sinks_H = nullptr;
    const Result with = p.run(cpu_kernels), without = p.run(cpu_kernels, plain);
    Tensor want_out = without.out.clone(), want_lse = without.lse.clone();
    for (int64_t bt = 0; bt < p.d.B * p.d.T; ++bt) {
      for (int64_t h = 0; h < p.d.Hq; ++h) {
        const double lse = without.lse.get(bt * p.d.Hq + h), sink = p.sinks.get(h);
        const double lse2 = std::max(lse, sink) + std::log1p(std::exp(-std::abs(lse - sink)));
        want_lse.set(bt * p.d.Hq + h, lse2);
        for (int64_t c = 0; c < p.d.P; ++c) {
          const int64_t at = (bt * p.d.Hq + h) * p.d.P + c;
          want_out.set(at, without.out.get(at) * std::exp(lse - lse2));
        }
      }
    }
    EXPECT_TRUE(all_close(with.lse, want_lse, 1e-14, 1e-14, "lse"));
    EXPECT_TRUE(all_close(with.out, want_out, 1e-13, 1e-14, "out"));
    EXPECT_FALSE(all_close(without.out, want_out, 1e-6, 1e-6, "out")) << "the sink changes out";
  }
}

// Changing the keys and values of position j leaves every query of the row
// at j + window or later bit-identical, and changes the query at j + window - 1.
TEST(AttentionSinksWindow, AWindowHidesOlderKeys) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (bool cpu_kernels : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (cpu_kernels ? " cpu" : " ref"));
      const Shape4 d{1, 140, 2, 1, 16};
      const int64_t W = 70, j = 30, row = d.Hkv * d.P, orow = d.Hq * d.P;
      Problem p(d, dt, W, true, 13);
      const Result before = p.run(cpu_kernels);
      for (int64_t c = 0; c < row; ++c) {
        p.k.set(j * row + c, 3.0 + double(c % 5));
        p.v.set(j * row + c, -5.0);
      }
      const Result after = p.run(cpu_kernels);
      int64_t changed_late = 0, changed_edge = 0;
      for (int64_t i = 0; i < d.T; ++i) {
        for (int64_t c = 0; c < orow; ++c) {
          const bool same = before.out.get(i * orow + c) == after.out.get(i * orow + c);
          if (i >= j + W) changed_late += !same;
          if (i == j + W - 1) changed_edge += !same;
        }
      }
      EXPECT_EQ(changed_late, 0);
      EXPECT_GT(changed_edge, 0);
    }
  }
}

// f64 finite differences of sum(r . out) in q, k, v and the sinks, through
// ref:: and cpu::, with a window and documents.
TEST(AttentionSinksWindow, GradientsMatchFiniteDifferences) {
  Problem p({2, 13, 4, 2, 8}, DType::f64, 4, true, 17, 6);
  Rng rng(18);
  const Tensor r = random_tensor(p.q.shape(), DType::f64, rng);
  p.dout = r.clone();
  for (bool cpu_kernels : {false, true}) {
    const std::string name = cpu_kernels ? "cpu " : "ref ";
    auto loss = [&] {
      Tensor out = Tensor::empty(p.q.shape(), DType::f64);
      Tensor lse = Tensor::empty({p.d.B, p.d.T, p.d.Hq}, DType::f64);
      (cpu_kernels ? cpu::attention_forward : ref::attention_forward)(out, lse, p.q, p.k, p.v,
                                                                      p.options());
      double s = 0;
      for (int64_t i = 0; i < out.numel(); ++i) s += out.get(i) * r.get(i);
      return s;
    };
    const Result g = p.run(cpu_kernels);
    EXPECT_TRUE(fd_check(loss, p.q, g.dq, name + "dq", 1e-6, 1e-8, 96));
    EXPECT_TRUE(fd_check(loss, p.k, g.dk, name + "dk", 1e-6, 1e-8, 96));
    EXPECT_TRUE(fd_check(loss, p.v, g.dv, name + "dv", 1e-6, 1e-8, 96));
    EXPECT_TRUE(fd_check(loss, p.sinks, g.dsinks, name + "dsinks", 1e-6, 1e-8));
  }
}

// dsinks adds onto what is there, like every gradient sink.
TEST(AttentionSinksWindow, DsinksAccumulates) {
  const Problem p({1, 20, 2, 1, 8}, DType::f32, 0, true, 23);
  const Result once = p.run(true);
  Tensor twice = once.dsinks.clone();
  Tensor dq = once.dq.clone(), dk = once.dk.clone(), dv = once.dv.clone();
  cpu::attention_backward(dq, dk, dv, p.dout, p.q, p.k, p.v, once.out, once.lse, p.options(), false,
                          &twice);
  for (int64_t h = 0; h < p.d.Hq; ++h) EXPECT_EQ(twice.get(h), 2 * once.dsinks.get(h));
}

class AttentionSinksWindowIsa : public testing::IsaTest<testing::IsaOnly> {};

TEST_P(AttentionSinksWindowIsa, MatchesRef) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Problem p({1, 150, 4, 2, 32}, dt, 50, true, 29, 90);
    EXPECT_TRUE(matches(p.run(true), p.run(false), dt)) << dtype_name(dt);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, AttentionSinksWindowIsa, testing::all_isas(),
                         testing::isa_param_name);

TEST(AttentionSinksWindow, ThreadCountChangesNoBit) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Problem p({2, 190, 8, 2, 64}, dt, 77, true, 31, 120);
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
      EXPECT_TRUE(bitwise_equal(runs[i].dsinks, runs[0].dsinks, "dsinks"));
    }
  }
}

TEST(AttentionSinksWindow, RejectsBadOptions) {
  const Problem p({1, 4, 2, 1, 8}, DType::f32, 0, true, 37);
  Tensor out = Tensor::empty(p.q.shape(), DType::f32), lse = Tensor::empty({1, 4, 2}, DType::f32);
  Tensor wide = Tensor::zeros({3}, DType::f32), f64_sinks = Tensor::zeros({2}, DType::f64);
  for (auto fwd : {cpu::attention_forward, ref::attention_forward}) {
    EXPECT_THROW(fwd(out, lse, p.q, p.k, p.v, {.window = -1}), Error);
    EXPECT_THROW(fwd(out, lse, p.q, p.k, p.v, {.sinks_H = &wide}), Error);
    EXPECT_THROW(fwd(out, lse, p.q, p.k, p.v, {.sinks_H = &f64_sinks}), Error);
  }
  const Result r = p.run(true);
  Tensor dq = r.dq.clone(), dk = r.dk.clone(), dv = r.dv.clone();
  Tensor dsinks = Tensor::zeros({2}, DType::f32), bf16_dsinks = Tensor::zeros({2}, DType::bf16);
  for (auto bwd : {cpu::attention_backward, ref::attention_backward}) {
    EXPECT_THROW(bwd(dq, dk, dv, p.dout, p.q, p.k, p.v, r.out, r.lse, {}, false, &dsinks), Error)
        << "dsinks without sinks";
    EXPECT_THROW(
        bwd(dq, dk, dv, p.dout, p.q, p.k, p.v, r.out, r.lse, p.options(), false, &bf16_dsinks),
        Error);
  }
}

}  // namespace
}  // namespace tiermoe
