// The gated delta rule (kernels/gated_delta.h): its gradients by finite
// differences, packed documents equal to each document alone, bf16 as one
// rounding of the f32 result, and its input checks. Against transformers'
// own kernel: tests/model/test_gated_delta_transformers.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>  // testing.h uses std::memcmp without including it
#include <vector>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/gated_delta.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

struct Inputs {
  Tensor q, k, v, g, beta;
};

// q and k as the layer gives them: any scale (the kernel does not normalise);
// g < 0 as -exp(A_log) softplus(.) makes it; beta in (0, 1).
Inputs random_inputs(int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, DType dt,
                     Rng& rng) {
  const DType sd = dt == DType::f64 ? DType::f64 : DType::f32;
  Inputs in{random_tensor({B, T, Hk, Dk}, dt, rng, 0.5),
            random_tensor({B, T, Hk, Dk}, dt, rng, 0.5), random_tensor({B, T, Hv, Dv}, dt, rng),
            random_tensor({B, T, Hv}, sd, rng), random_tensor({B, T, Hv}, sd, rng)};
  for (int64_t i = 0; i < in.g.numel(); ++i) {
    in.g.set(i, -std::log1p(std::exp(in.g.get(i))));  // -softplus
    in.beta.set(i, 1.0 / (1.0 + std::exp(-in.beta.get(i))));
  }
  return in;
}

// Tokens [from, from + len) of a one-row [1, T, ...] tensor.
Tensor tokens_of(const Tensor& x, int64_t from, int64_t len) {
  Shape shape = x.shape();
  const size_t per_token = x.nbytes() / size_t(shape[1]);
  shape[1] = len;
  Tensor y = Tensor::empty(shape, x.dtype());
  std::memcpy(y.raw(), static_cast<const char*>(x.raw()) + size_t(from) * per_token,
              size_t(len) * per_token);
  return y;
}

Tensor run_forward(const Inputs& in, const GatedDeltaOptions& opt = {}) {
  Tensor out = Tensor::empty(in.v.shape(), in.v.dtype());
  ref::gated_delta_forward(out, in.q, in.k, in.v, in.g, in.beta, opt);
  return out;
}

// Finite differences of sum(out * P) for every input, with documents packed
// two to a row (the state resets between them) and grouped heads.
TEST(GatedDelta, GradientsMatchFiniteDifferences) {
  Rng rng(3);
  Inputs in = random_inputs(2, 7, 2, 4, 5, 3, DType::f64, rng);
  const std::vector<int32_t> starts = {0, 0, 0, 3, 3, 3, 3, 0, 0, 0, 0, 0, 5, 5};
  const GatedDeltaOptions opt{starts};
  const Tensor P = random_tensor(in.v.shape(), DType::f64, rng);
  auto loss = [&] {
    const Tensor out = run_forward(in, opt);
    double s = 0;
    for (int64_t i = 0; i < out.numel(); ++i) s += out.get(i) * P.get(i);
    return s;
  };
  Tensor dq = Tensor::empty(in.q.shape(), DType::f64), dk = Tensor::empty(in.k.shape(), DType::f64);
  Tensor dv = Tensor::empty(in.v.shape(), DType::f64), dg = Tensor::empty(in.g.shape(), DType::f64);
  Tensor dbeta = Tensor::empty(in.beta.shape(), DType::f64);
  ref::gated_delta_backward(dq, dk, dv, dg, dbeta, P, in.q, in.k, in.v, in.g, in.beta, opt);
  EXPECT_TRUE(fd_check(loss, in.q, dq, "q", 1e-6, 1e-9, 200));
  EXPECT_TRUE(fd_check(loss, in.k, dk, "k", 1e-6, 1e-9, 200));
  EXPECT_TRUE(fd_check(loss, in.v, dv, "v", 1e-6, 1e-9, 200));
  EXPECT_TRUE(fd_check(loss, in.g, dg, "g", 1e-6, 1e-9, 200));
  EXPECT_TRUE(fd_check(loss, in.beta, dbeta, "beta", 1e-6, 1e-9, 200));
  double norm = 0;
  for (const Tensor* t : {&dq, &dk, &dg}) {
    for (int64_t i = 0; i < t->numel(); ++i) norm += std::abs(t->get(i));
  }
  EXPECT_GT(norm, 1e-2);
  // At a document's first token the state starts from zero: its decay moves nothing.
  EXPECT_EQ(dg.get((0 * 7 + 3) * 4 + 1), 0.0);
  EXPECT_EQ(dg.get((1 * 7 + 5) * 4 + 2), 0.0);
}

TEST(GatedDelta, L2NormGradientMatchesFiniteDifferences) {
  Rng rng(5);
  Tensor x = random_tensor({3, 4, 6}, DType::f64, rng);
  const Tensor P = random_tensor(x.shape(), DType::f64, rng);
  auto loss = [&] {
    Tensor y = Tensor::empty(x.shape(), DType::f64);
    ref::l2norm_forward(y, x, 0.4);
    double s = 0;
    for (int64_t i = 0; i < y.numel(); ++i) s += y.get(i) * P.get(i);
    return s;
  };
  Tensor dx = Tensor::empty(x.shape(), DType::f64);
  ref::l2norm_backward(dx, P, x, 0.4);
  EXPECT_TRUE(fd_check(loss, x, dx, "x", 1e-6, 1e-9, 200));
}

// g and beta from the projections: finite differences for a, b, A_log and
// dt_bias through sum(g * Pg + beta * Pb), a crossing softplus's threshold.
TEST(GatedDelta, GatesGradientsMatchFiniteDifferences) {
  Rng rng(6);
  Tensor a = random_tensor({2, 3, 4}, DType::f64, rng, 3.0);
  a.set(0, 25.0);  // past the threshold: softplus(x) = x
  Tensor b = random_tensor({2, 3, 4}, DType::f64, rng);
  Tensor A_log = random_tensor({4}, DType::f64, rng), dt_bias = random_tensor({4}, DType::f64, rng);
  const Tensor Pg = random_tensor(a.shape(), DType::f64, rng);
  const Tensor Pb = random_tensor(a.shape(), DType::f64, rng);
  Tensor g = Tensor::empty(a.shape(), DType::f64), beta = Tensor::empty(a.shape(), DType::f64);
  auto loss = [&] {
    ref::gated_delta_gates_forward(g, beta, a, b, A_log, dt_bias);
    double s = 0;
    for (int64_t i = 0; i < g.numel(); ++i) s += g.get(i) * Pg.get(i) + beta.get(i) * Pb.get(i);
    return s;
  };
  Tensor da = Tensor::empty(a.shape(), DType::f64), db = Tensor::empty(b.shape(), DType::f64);
  Tensor dA = Tensor::zeros({4}, DType::f64), ddt = Tensor::zeros({4}, DType::f64);
  ref::gated_delta_gates_backward(da, db, dA, ddt, Pg, Pb, a, b, A_log, dt_bias);
  EXPECT_TRUE(fd_check(loss, a, da, "a", 1e-6, 1e-9, 200));
  EXPECT_TRUE(fd_check(loss, b, db, "b", 1e-6, 1e-9, 200));
  EXPECT_TRUE(fd_check(loss, A_log, dA, "A_log", 1e-6, 1e-9, 200));
  EXPECT_TRUE(fd_check(loss, dt_bias, ddt, "dt_bias", 1e-6, 1e-9, 200));
  loss();
  EXPECT_DOUBLE_EQ(g.get(0), -std::exp(A_log.get(0)) * (25.0 + dt_bias.get(0)));
}

// A row of packed documents gives, token for token, what each document gives
// alone: the state does not cross a boundary. Bitwise, in f64 and f32.
TEST(GatedDelta, PackedDocumentsEqualEachAlone) {
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Rng rng(7);
    const int64_t T = 8, Hk = 1, Hv = 2, Dk = 4, Dv = 3;
    const Inputs in = random_inputs(1, T, Hk, Hv, Dk, Dv, dt, rng);
    const std::vector<int32_t> starts = {0, 0, 0, 3, 3, 3, 3, 3};
    const Tensor packed = run_forward(in, {starts});
    for (const auto& [from, len] : {std::pair<int64_t, int64_t>{0, 3}, {3, 5}}) {
      auto cut = [&](const Tensor& x) { return tokens_of(x, from, len); };
      const Tensor alone = run_forward({cut(in.q), cut(in.k), cut(in.v), cut(in.g), cut(in.beta)});
      EXPECT_TRUE(bitwise_equal(alone, cut(packed), "document alone"));
    }
  }
}

// Within every |want| scale: rtol of the tensor's largest value (a gradient
// that is 0 in ref::, as dg at a document's first token, is a sum that
// cancels in the chunked form).
::testing::AssertionResult close_in_scale(const Tensor& got, const Tensor& want, double rtol,
                                          const std::string& name) {
  double scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::abs(want.get(i)));
  return all_close(got, want, rtol, rtol * scale, name);
}

std::vector<Tensor> cpu_grads(const Inputs& in, const Tensor& dout, const GatedDeltaOptions& opt,
                              bool use_ref = false) {
  const DType dt = in.q.dtype();
  std::vector<Tensor> g = {Tensor::empty(in.q.shape(), dt), Tensor::empty(in.k.shape(), dt),
                           Tensor::empty(in.v.shape(), dt),
                           Tensor::empty(in.g.shape(), in.g.dtype()),
                           Tensor::empty(in.beta.shape(), in.beta.dtype())};
  (use_ref ? ref::gated_delta_backward : cpu::gated_delta_backward)(
      g[0], g[1], g[2], g[3], g[4], dout, in.q, in.k, in.v, in.g, in.beta, opt);
  return g;
}

// cpu::'s chunked form equals ref::'s recurrence to rounding (f64: 1e-11 of
// each tensor's scale; f32 and bf16 inputs: 1e-4, the f32 state's rounding
// over a few chunks), forward and backward, with chunks cut short by the
// row's end and by packed documents, and grouped heads; and 1 and 2 threads
// give the same bits.
TEST(GatedDelta, CpuEqualsRefToRoundingOnAnyThreadCount) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (int64_t T : {1, 64, 130, 200}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " T " + std::to_string(T));
      Rng rng(static_cast<uint64_t>(T));
      const Inputs in = random_inputs(2, T, 2, 4, 5, 3, dt, rng);
      std::vector<int32_t> starts(size_t(2 * T), 0);
      for (int64_t t = 0; t < T; ++t) starts[size_t(T + t)] = int32_t(t < T / 2 ? 0 : T / 2);
      const GatedDeltaOptions opt{starts};
      const double rtol = dt == DType::f64 ? 1e-11 : 1e-4;
      Tensor want = Tensor::empty(in.v.shape(), dt);
      ref::gated_delta_forward(want, in.q, in.k, in.v, in.g, in.beta, opt);
      const Tensor dout = random_tensor(in.v.shape(), dt, rng);
      const auto want_grads = cpu_grads(in, dout, opt, /*use_ref=*/true);
      std::vector<Tensor> first;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Tensor out = Tensor::empty(in.v.shape(), dt);
        cpu::gated_delta_forward(out, in.q, in.k, in.v, in.g, in.beta, opt);
        // bf16 outputs round the f32 result once: half an ulp of 2^-8 apart.
        EXPECT_TRUE(close_in_scale(out, want, dt == DType::bf16 ? 1e-2 : rtol, "out"));
        auto got = cpu_grads(in, dout, opt);
        const char* names[] = {"dq", "dk", "dv", "dg", "dbeta"};
        for (int i = 0; i < 5; ++i) {
          const bool rounded = dt == DType::bf16 && i < 3;
          EXPECT_TRUE(close_in_scale(got[i], want_grads[i], rounded ? 1e-2 : rtol, names[i]));
        }
        got.push_back(out);
        if (first.empty()) {
          first = got;
        } else {
          for (size_t i = 0; i < got.size(); ++i)
            EXPECT_TRUE(bitwise_equal(got[i], first[i], "threads"));
        }
      }
    }
  }
  set_num_threads(0);
}

// A chunk's products are the rule: a broken one moves the comparison far
// past its tolerance (here a document boundary the kernel is not told of).
TEST(GatedDelta, TheComparisonSeesADroppedReset) {
  Rng rng(3);
  const Inputs in = random_inputs(1, 100, 1, 1, 4, 3, DType::f64, rng);
  std::vector<int32_t> starts(100, 0);
  for (int t = 40; t < 100; ++t) starts[size_t(t)] = 40;
  Tensor want = Tensor::empty(in.v.shape(), DType::f64), got = want.clone();
  ref::gated_delta_forward(want, in.q, in.k, in.v, in.g, in.beta, {starts});
  cpu::gated_delta_forward(got, in.q, in.k, in.v, in.g, in.beta, {});
  EXPECT_FALSE(close_in_scale(got, want, 1e-6, "out"));
}

// Each document of a packed row, in cpu::'s chunks, is bitwise the document
// alone: chunks start at its first token wherever it sits.
TEST(GatedDelta, CpuPackedDocumentsEqualEachAloneBitwise) {
  Rng rng(11);
  const int64_t T = 150, Hk = 1, Hv = 2, Dk = 4, Dv = 3;
  const Inputs in = random_inputs(1, T, Hk, Hv, Dk, Dv, DType::f32, rng);
  std::vector<int32_t> starts(size_t(T), 0);
  for (int64_t t = 70; t < T; ++t) starts[size_t(t)] = 70;
  const Tensor dout = random_tensor(in.v.shape(), DType::f32, rng);
  Tensor packed = Tensor::empty(in.v.shape(), DType::f32);
  cpu::gated_delta_forward(packed, in.q, in.k, in.v, in.g, in.beta, {starts});
  const auto packed_grads = cpu_grads(in, dout, {starts});
  for (const auto& [from, len] : {std::pair<int64_t, int64_t>{0, 70}, {70, 80}}) {
    auto cut = [&](const Tensor& x) { return tokens_of(x, from, len); };
    const Inputs alone{cut(in.q), cut(in.k), cut(in.v), cut(in.g), cut(in.beta)};
    Tensor out = Tensor::empty(alone.v.shape(), DType::f32);
    cpu::gated_delta_forward(out, alone.q, alone.k, alone.v, alone.g, alone.beta, {});
    EXPECT_TRUE(bitwise_equal(out, cut(packed), "out"));
    const auto grads = cpu_grads(alone, cut(dout), {});
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(bitwise_equal(grads[i], cut(packed_grads[i]), "grad"));
  }
}

// bf16 inputs are widened and out is the f32 result rounded once.
TEST(GatedDelta, Bf16IsTheF32ResultRoundedOnce) {
  Rng rng(9);
  const Inputs in = random_inputs(2, 5, 2, 2, 4, 4, DType::bf16, rng);
  const Tensor out16 = run_forward(in);
  const Tensor out32 =
      run_forward({in.q.to(DType::f32), in.k.to(DType::f32), in.v.to(DType::f32), in.g, in.beta});
  EXPECT_TRUE(bitwise_equal(out16, out32.to(DType::bf16), "out"));
}

TEST(GatedDelta, BadInputsAreRefusedByName) {
  Rng rng(1);
  const Inputs in = random_inputs(1, 4, 2, 3, 4, 4, DType::f32, rng);
  Tensor out = Tensor::empty(in.v.shape(), DType::f32);
  EXPECT_TRUE(
      throws_error_with([&] { ref::gated_delta_forward(out, in.q, in.k, in.v, in.g, in.beta); },
                        {"gated_delta_forward", "multiple of q's"}));
  const Inputs ok = random_inputs(1, 4, 2, 4, 4, 4, DType::f32, rng);
  Tensor out4 = Tensor::empty(ok.v.shape(), DType::f32);
  const Tensor g16 = ok.g.to(DType::bf16);
  EXPECT_TRUE(throws_error_with(
      [&] { ref::gated_delta_forward(out4, ok.q, ok.k, ok.v, g16, ok.beta); }, {"g", "f32"}));
  const std::vector<int32_t> bad = {0, 0, 1, 1};
  EXPECT_TRUE(throws_error_with(
      [&] { ref::gated_delta_forward(out4, ok.q, ok.k, ok.v, ok.g, ok.beta, {bad}); },
      {"doc_start_BT", "contiguous"}));
}

}  // namespace
