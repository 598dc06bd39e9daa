// The attention kernels with a v head dim of its own (Pv != P, as DeepSeek-V3's
// multi-head latent attention has: q.k over 192, v over 128) and a score scale
// other than P^-0.5 (MLA's mscale), kernels/attention.h. ref:: is held to f64
// finite differences and to two identities that do not share its code (a
// narrower v is the first columns of a wider one; a scale is the default
// scale on a scaled q); cpu:: is held to ref:: in every dtype and on every
// ISA, with the thread count changing no bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "isa_test_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/attention.h"

namespace tiermoe {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::fd_check;
using testing::random_tensor;

struct Dims {
  int64_t B, T, Hq, Hkv, P, Pv;
};

DType acc_of(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

struct Result {
  Tensor out, lse, dq, dk, dv;
};

struct Problem {
  Dims d;
  DType dt;
  Tensor q, k, v, dout;
  AttentionOptions opt;

  Problem(const Dims& dims, DType dtype, double scale, uint64_t seed) : d(dims), dt(dtype) {
    Rng rng(seed);
    q = random_tensor({d.B, d.T, d.Hq, d.P}, dt, rng);
    k = random_tensor({d.B, d.T, d.Hkv, d.P}, dt, rng);
    v = random_tensor({d.B, d.T, d.Hkv, d.Pv}, dt, rng);
    dout = random_tensor({d.B, d.T, d.Hq, d.Pv}, dt, rng);
    opt.scale = scale;
  }

  Result run(bool cpu_kernels) const {
    Result r{Tensor::empty(dout.shape(), dt), Tensor::empty({d.B, d.T, d.Hq}, acc_of(dt)),
             Tensor::empty(q.shape(), dt), Tensor::empty(k.shape(), dt),
             Tensor::empty(v.shape(), dt)};
    (cpu_kernels ? cpu::attention_forward : ref::attention_forward)(r.out, r.lse, q, k, v, opt);
    (cpu_kernels ? cpu::attention_backward : ref::attention_backward)(
        r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, opt, false, nullptr);
    return r;
  }
};

// test_flash_attention's bounds (f64: the row path's backward sums in
// another order).
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

// DeepSeek-V3's head (192 / 128) and smaller splits both ways, with its
// scale (mscale 1 + 0.1 ln 40 squared over sqrt(192)) and without.
TEST(AttentionSplitHeads, CpuMatchesRef) {
  const double mla_scale = std::pow(1 + 0.1 * std::log(40.0), 2) / std::sqrt(192.0);
  const std::vector<std::pair<Dims, double>> cases = {{{1, 70, 4, 4, 192, 128}, mla_scale},
                                                      {{2, 20, 4, 2, 24, 16}, 0.0},
                                                      {{1, 130, 2, 1, 16, 40}, 0.3},
                                                      {{1, 9, 2, 2, 8, 8}, 1.5}};
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    uint64_t seed = 500;
    for (const auto& [d, scale] : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " P " + std::to_string(d.P) + " Pv " +
                   std::to_string(d.Pv) + " scale " + std::to_string(scale));
      const Problem p(d, dt, scale, seed++);
      const Result cpu = p.run(true), ref = p.run(false);
      EXPECT_TRUE(matches(cpu, ref, dt));
      if (dt == DType::f64) EXPECT_TRUE(bitwise_equal(cpu.out, ref.out, "out"));
    }
  }
}

// A narrower v is the first Pv columns of a wider one: the probabilities do
// not depend on v, and each output column sums its own values.
TEST(AttentionSplitHeads, ANarrowVIsTheFirstColumnsOfAWideOne) {
  for (bool cpu_kernels : {false, true}) {
    SCOPED_TRACE(cpu_kernels ? "cpu" : "ref");
    const Problem wide({2, 11, 4, 2, 12, 12}, DType::f64, 0.0, 7);
    Problem narrow({2, 11, 4, 2, 12, 5}, DType::f64, 0.0, 7);
    for (int64_t r = 0; r < 2 * 11 * 2; ++r) {
      for (int64_t c = 0; c < 5; ++c) narrow.v.set(r * 5 + c, wide.v.get(r * 12 + c));
    }
    const Result w = wide.run(cpu_kernels), n = narrow.run(cpu_kernels);
    EXPECT_TRUE(bitwise_equal(n.lse, w.lse, "lse"));
    for (int64_t r = 0; r < 2 * 11 * 4; ++r) {
      for (int64_t c = 0; c < 5; ++c) {
        ASSERT_EQ(n.out.get(r * 5 + c), w.out.get(r * 12 + c)) << "row " << r << " col " << c;
      }
    }
  }
}

// A scale s on q . k is the default scale P^-0.5 on q * s * sqrt(P).
TEST(AttentionSplitHeads, AScaleIsTheDefaultScaleOnAScaledQuery) {
  for (bool cpu_kernels : {false, true}) {
    SCOPED_TRACE(cpu_kernels ? "cpu" : "ref");
    const double s = 0.37;
    const Problem scaled({1, 17, 2, 1, 16, 8}, DType::f64, s, 9);
    Problem plain({1, 17, 2, 1, 16, 8}, DType::f64, 0.0, 9);
    for (int64_t i = 0; i < plain.q.numel(); ++i) plain.q.set(i, plain.q.get(i) * s * 4.0);
    const Result a = scaled.run(cpu_kernels), b = plain.run(cpu_kernels);
    EXPECT_TRUE(all_close(a.out, b.out, 1e-13, 1e-14, "out"));
    EXPECT_TRUE(all_close(a.lse, b.lse, 1e-13, 1e-14, "lse"));
    EXPECT_FALSE(all_close(a.out,
                           Problem({1, 17, 2, 1, 16, 8}, DType::f64, 0.0, 9).run(cpu_kernels).out,
                           1e-6, 1e-6, "out"))
        << "the scale changes the output";
  }
}

TEST(AttentionSplitHeads, GradientsMatchFiniteDifferences) {
  Problem p({2, 9, 4, 2, 12, 6}, DType::f64, 0.21, 17);
  Rng rng(18);
  const Tensor r = random_tensor(p.dout.shape(), DType::f64, rng);
  p.dout = r.clone();
  for (bool cpu_kernels : {false, true}) {
    const std::string name = cpu_kernels ? "cpu " : "ref ";
    auto loss = [&] {
      Tensor out = Tensor::empty(p.dout.shape(), DType::f64);
      Tensor lse = Tensor::empty({p.d.B, p.d.T, p.d.Hq}, DType::f64);
      (cpu_kernels ? cpu::attention_forward : ref::attention_forward)(out, lse, p.q, p.k, p.v,
                                                                      p.opt);
      double s = 0;
      for (int64_t i = 0; i < out.numel(); ++i) s += out.get(i) * r.get(i);
      return s;
    };
    const Result g = p.run(cpu_kernels);
    EXPECT_TRUE(fd_check(loss, p.q, g.dq, name + "dq", 1e-6, 1e-8, 96));
    EXPECT_TRUE(fd_check(loss, p.k, g.dk, name + "dk", 1e-6, 1e-8, 96));
    EXPECT_TRUE(fd_check(loss, p.v, g.dv, name + "dv", 1e-6, 1e-8, 96));
  }
}

class AttentionSplitHeadsIsa : public testing::IsaTest<testing::IsaOnly> {};

TEST_P(AttentionSplitHeadsIsa, MatchesRef) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Problem p({1, 90, 4, 2, 48, 32}, dt, 0.11, 29);
    EXPECT_TRUE(matches(p.run(true), p.run(false), dt)) << dtype_name(dt);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, AttentionSplitHeadsIsa, testing::all_isas(), testing::isa_param_name);

TEST(AttentionSplitHeads, ThreadCountChangesNoBit) {
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Problem p({2, 150, 8, 2, 64, 40}, dt, 0.09, 31);
    std::vector<Result> runs;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      runs.push_back(p.run(true));
    }
    set_num_threads(0);
    for (size_t i = 1; i < runs.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(runs[i].out, runs[0].out, "out"));
      EXPECT_TRUE(bitwise_equal(runs[i].dq, runs[0].dq, "dq"));
      EXPECT_TRUE(bitwise_equal(runs[i].dk, runs[0].dk, "dk"));
      EXPECT_TRUE(bitwise_equal(runs[i].dv, runs[0].dv, "dv"));
    }
  }
}

TEST(AttentionSplitHeads, RejectsMismatchedHeadsAndBadScales) {
  const Problem p({1, 4, 2, 1, 8, 6}, DType::f32, 0.0, 37);
  Tensor lse = Tensor::empty({1, 4, 2}, DType::f32);
  Tensor wide_out = Tensor::empty({1, 4, 2, 8}, DType::f32);  // P wide, not Pv
  Tensor out = Tensor::empty({1, 4, 2, 6}, DType::f32);
  for (auto fwd : {cpu::attention_forward, ref::attention_forward}) {
    EXPECT_TRUE(testing::throws_error_with([&] { fwd(wide_out, lse, p.q, p.k, p.v, {}); },
                                           {"out", "[1, 4, 2, 6]"}));
    EXPECT_THROW(fwd(out, lse, p.q, p.k, p.v, {.scale = -1.0}), Error);
    EXPECT_THROW(fwd(out, lse, p.q, p.k, p.v, {.scale = NAN}), Error);
    EXPECT_NO_THROW(fwd(out, lse, p.q, p.k, p.v, {}));
  }
}

}  // namespace
}  // namespace tiermoe
