#include <gtest/gtest.h>

#include <cstring>  // testing.h uses std::memcmp without including it
#include <vector>

#include "common/testing.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/attention.h"
#include "tiermoe/kernels/rmsnorm.h"
#include "tiermoe/kernels/rope.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

DType acc_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

double weighted_sum(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += y.get(i) * r.get(i);
  return s;
}

struct Dims {
  int64_t B, T, Hq, Hkv, P;
};

struct Inputs {
  Tensor q, k, v;
};
Inputs random_inputs(const Dims& d, DType dt, Rng& rng) {
  return {random_tensor({d.B, d.T, d.Hq, d.P}, dt, rng),
          random_tensor({d.B, d.T, d.Hkv, d.P}, dt, rng),
          random_tensor({d.B, d.T, d.Hkv, d.P}, dt, rng)};
}

struct Grads {
  Tensor dq, dk, dv;
};
template <class Fwd, class Bwd>
void run(Fwd fwd, Bwd bwd, const Inputs& in, const Tensor& dout, Tensor& out, Tensor& lse,
         Grads& g) {
  fwd(out, lse, in.q, in.k, in.v, {});
  bwd(g.dq, g.dk, g.dv, dout, in.q, in.k, in.v, out, lse, {}, false, nullptr);
}
Grads empty_grads(const Inputs& in) {
  return {Tensor::empty(in.q.shape(), in.q.dtype()), Tensor::empty(in.k.shape(), in.k.dtype()),
          Tensor::empty(in.v.shape(), in.v.dtype())};
}

// Tolerances, cpu:: against ref:: (rtol, atol; inputs are N(0, 1)). In f64
// the forward is bitwise (the row path sums in ref::'s order); these cover
// its backward, f32 and bf16 (the flash kernel), and outputs downstream of
// other kernels that differ in the last bits (the Qwen3 core below).
// f64: backward's p = exp(s - lse) against ref's exp(s - m) / sum, and dk, dv
// summed in another order: a few ulps, amplified by cancellation in (dp - D)
// and by sums over up to T*g terms, hence an absolute floor.
// f32: the flash kernel's online softmax rescales by exp(m - m') per key
// block, its exp is a polynomial good to ~2 ulps and D = dO . out: ulps too.
// bf16: scores are rounded to bf16 (as HF does), so inputs that differ in the
// last bits can put a score one bf16 ulp (2^-8 relative, ~0.01 at |s| ~ 2)
// apart; that moves a probability by ~1% and the output by about one bf16
// ulp of its scale; the flash kernel also keeps P unrounded where ref rounds
// it (HF eager's cast). 4 ulps relative plus 2^-6 absolute covers it;
// gradients (ds = p (dp - D)) move by about 1% of their scale, so 2^-5.
struct Tol {
  double rtol, atol;
};
Tol out_tol(DType dt) {
  switch (dt) {
    case DType::f64:
      return {1e-12, 1e-13};
    case DType::f32:
      return {1e-5, 1e-6};
    case DType::bf16:
      return {1.0 / 32, 1.0 / 64};
  }
  return {};
}
Tol grad_tol(DType dt) {
  switch (dt) {
    case DType::f64:
      return {1e-11, 1e-12};
    case DType::f32:
      return {1e-4, 1e-5};
    case DType::bf16:
      return {1.0 / 32, 1.0 / 32};
  }
  return {};
}

const Dims kShapes[] = {
    {1, 1, 1, 1, 4},    // a single row: only t = 0, which sees itself
    {2, 3, 2, 2, 7},    // group size 1 (multi-head), odd head dim
    {1, 17, 4, 2, 64},  // group size 2, T not a multiple of the row block
    {2, 5, 6, 2, 130},  // group size 3
    {1, 40, 4, 1, 8},   // multi-query: one kv head for all
};

}  // namespace

TEST(Attention, CpuMatchesRef) {
  Rng rng(61);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (const Dims& d : kShapes) {
      Inputs in = random_inputs(d, dt, rng);
      Tensor dout = random_tensor(in.q.shape(), dt, rng);
      Tensor out_ref = Tensor::empty(in.q.shape(), dt), out_cpu = Tensor::empty(in.q.shape(), dt);
      Tensor lse_ref = Tensor::empty({d.B, d.T, d.Hq}, acc_dtype(dt));
      Tensor lse_cpu = Tensor::empty({d.B, d.T, d.Hq}, acc_dtype(dt));
      Grads g_ref = empty_grads(in), g_cpu = empty_grads(in);
      run(ref::attention_forward, ref::attention_backward, in, dout, out_ref, lse_ref, g_ref);
      run(cpu::attention_forward, cpu::attention_backward, in, dout, out_cpu, lse_cpu, g_cpu);
      const std::string what = in.q.str() + " kv " + in.k.str();
      Tol gt = grad_tol(dt);
      if (dt == DType::f64) {
        // The row path sums every dot product and row in ref::'s order.
        EXPECT_TRUE(bitwise_equal(out_cpu, out_ref, "out " + what));
        EXPECT_TRUE(bitwise_equal(lse_cpu, lse_ref, "lse " + what));
      } else {
        const Tol ot = out_tol(dt);
        EXPECT_TRUE(all_close(out_cpu, out_ref, ot.rtol, ot.atol, "out " + what));
        EXPECT_TRUE(all_close(lse_cpu, lse_ref, ot.rtol, ot.atol, "lse " + what));
      }
      EXPECT_TRUE(all_close(g_cpu.dq, g_ref.dq, gt.rtol, gt.atol, "dq " + what));
      EXPECT_TRUE(all_close(g_cpu.dk, g_ref.dk, gt.rtol, gt.atol, "dk " + what));
      EXPECT_TRUE(all_close(g_cpu.dv, g_ref.dv, gt.rtol, gt.atol, "dv " + what));

      // accumulate adds onto what is there.
      Grads twice = {g_cpu.dq.clone(), g_cpu.dk.clone(), g_cpu.dv.clone()};
      cpu::attention_backward(twice.dq, twice.dk, twice.dv, dout, in.q, in.k, in.v, out_cpu,
                              lse_cpu, {}, true);
      Tensor doubled = g_cpu.dk.clone();
      for (int64_t i = 0; i < doubled.numel(); ++i) doubled.set(i, 2 * g_cpu.dk.get(i));
      EXPECT_TRUE(all_close(twice.dk, doubled, 0, 0, "accumulated dk " + what));
    }
  }
}

// Row 0 sees only key 0 (p = 1), and no row sees a later key: changing the
// last position's k and v leaves every earlier output bit-identical.
TEST(Attention, CausalMask) {
  Rng rng(62);
  Dims d{2, 6, 4, 2, 8};
  for (int twin = 0; twin < 2; ++twin) {
    auto fwd = twin ? cpu::attention_forward : ref::attention_forward;
    Inputs in = random_inputs(d, DType::f64, rng);
    Tensor out = Tensor::empty(in.q.shape(), DType::f64),
           lse = Tensor::empty({2, 6, 4}, DType::f64);
    fwd(out, lse, in.q, in.k, in.v, {});
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t c = 0; c < 8; ++c) {
          EXPECT_EQ(out.get(((b * 6) * 4 + h) * 8 + c), in.v.get(((b * 6) * 2 + h / 2) * 8 + c));
        }
      }
    }
    Tensor before = out.clone();
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 2 * 8; ++i) {
        in.k.set((b * 6 + 5) * 16 + i, 100.0 + double(i));
        in.v.set((b * 6 + 5) * 16 + i, -100.0);
      }
    }
    fwd(out, lse, in.q, in.k, in.v, {});
    int64_t changed = 0;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 6 * 32; ++i) {
        int64_t at = b * 6 * 32 + i;
        if (i < 5 * 32)
          ASSERT_EQ(out.get(at), before.get(at)) << "b " << b << " t " << i / 32;
        else
          changed += out.get(at) != before.get(at);
      }
    }
    EXPECT_GT(changed, 0) << "the last row must see the changed key";
  }
}

// GQA equals multi-head attention on kv heads repeated g times
// (repeat_interleave, as HF's repeat_kv), and dk/dv are the group sums.
TEST(Attention, GroupedQueryEqualsRepeatedKv) {
  Rng rng(63);
  Dims d{1, 7, 6, 2, 5};
  int64_t g = d.Hq / d.Hkv;
  Inputs in = random_inputs(d, DType::f64, rng);
  Inputs rep{in.q, Tensor::empty({1, 7, 6, 5}, DType::f64),
             Tensor::empty({1, 7, 6, 5}, DType::f64)};
  for (int64_t t = 0; t < 7; ++t)
    for (int64_t h = 0; h < 6; ++h)
      for (int64_t c = 0; c < 5; ++c) {
        rep.k.set((t * 6 + h) * 5 + c, in.k.get((t * 2 + h / g) * 5 + c));
        rep.v.set((t * 6 + h) * 5 + c, in.v.get((t * 2 + h / g) * 5 + c));
      }
  Tensor dout = random_tensor(in.q.shape(), DType::f64, rng);
  for (int twin = 0; twin < 2; ++twin) {
    auto fwd = twin ? cpu::attention_forward : ref::attention_forward;
    auto bwd = twin ? cpu::attention_backward : ref::attention_backward;
    Tensor out = Tensor::empty(in.q.shape(), DType::f64), out_rep = out.clone();
    Tensor lse = Tensor::empty({1, 7, 6}, DType::f64), lse_rep = lse.clone();
    Grads gr = empty_grads(in), gr_rep = empty_grads(rep);
    run(fwd, bwd, in, dout, out, lse, gr);
    run(fwd, bwd, rep, dout, out_rep, lse_rep, gr_rep);
    EXPECT_TRUE(bitwise_equal(out, out_rep, "gqa out"));
    EXPECT_TRUE(all_close(gr.dq, gr_rep.dq, 1e-13, 1e-14, "gqa dq"));
    for (int64_t t = 0; t < 7; ++t)
      for (int64_t kvh = 0; kvh < 2; ++kvh)
        for (int64_t c = 0; c < 5; ++c) {
          double sk = 0, sv = 0;
          for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h) {
            sk += gr_rep.dk.get((t * 6 + h) * 5 + c);
            sv += gr_rep.dv.get((t * 6 + h) * 5 + c);
          }
          EXPECT_NEAR(gr.dk.get((t * 2 + kvh) * 5 + c), sk, 1e-13);
          EXPECT_NEAR(gr.dv.get((t * 2 + kvh) * 5 + c), sv, 1e-13);
        }
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  Rng rng(64);
  for (Dims d : {Dims{2, 4, 4, 2, 3}, Dims{1, 5, 3, 3, 4}}) {
    Inputs in = random_inputs(d, DType::f64, rng);
    Tensor r = random_tensor(in.q.shape(), DType::f64, rng);
    Tensor out = Tensor::empty(in.q.shape(), DType::f64);
    Tensor lse = Tensor::empty({d.B, d.T, d.Hq}, DType::f64);
    for (int twin = 0; twin < 2; ++twin) {
      auto fwd = twin ? cpu::attention_forward : ref::attention_forward;
      auto bwd = twin ? cpu::attention_backward : ref::attention_backward;
      auto loss = [&] {
        fwd(out, lse, in.q, in.k, in.v, {});
        return weighted_sum(out, r);
      };
      Grads g = empty_grads(in);
      run(fwd, bwd, in, r, out, lse, g);
      std::string name = std::string(twin ? "cpu" : "ref") + " attention ";
      EXPECT_TRUE(fd_check(loss, in.q, g.dq, name + "dq", 1e-6, 1e-8, 96));
      EXPECT_TRUE(fd_check(loss, in.k, g.dk, name + "dk", 1e-6, 1e-8, 96));
      EXPECT_TRUE(fd_check(loss, in.v, g.dv, name + "dv", 1e-6, 1e-8, 96));
    }
  }
}

TEST(Attention, RejectsBadShapes) {
  Tensor q = Tensor::zeros({1, 4, 3, 8}, DType::f32), out = q.clone();
  Tensor k = Tensor::zeros({1, 4, 2, 8}, DType::f32), v = k.clone();
  Tensor lse = Tensor::zeros({1, 4, 3}, DType::f32);
  EXPECT_THROW(cpu::attention_forward(out, lse, q, k, v), Error);  // 3 heads over 2 kv heads
  EXPECT_THROW(ref::attention_forward(out, lse, q, k, v), Error);
  Tensor q4 = Tensor::zeros({1, 4, 4, 8}, DType::f32), out4 = q4.clone();
  Tensor lse4 = Tensor::zeros({1, 4, 4}, DType::f32);
  Tensor k_short = Tensor::zeros({1, 3, 2, 8}, DType::f32);
  EXPECT_THROW(cpu::attention_forward(out4, lse4, q4, k_short, k_short), Error);
  Tensor v_bf16 = Tensor::zeros({1, 4, 2, 8}, DType::bf16);
  EXPECT_THROW(cpu::attention_forward(out4, lse4, q4, k, v_bf16), Error);
  Tensor lse_bf16 = Tensor::zeros({1, 4, 4}, DType::bf16);
  EXPECT_THROW(cpu::attention_forward(out4, lse_bf16, q4, k, v), Error);
  Tensor lse_t = Tensor::zeros({1, 4, 3}, DType::f32);
  EXPECT_THROW(cpu::attention_forward(out4, lse_t, q4, k, v), Error);
}

// ---- Qwen3 attention core: per-head q/k RMSNorm, RoPE, then attention ----

namespace {

struct Kernels {
  decltype(&ref::rmsnorm_forward) norm_fwd;
  decltype(&ref::rmsnorm_backward) norm_bwd;
  decltype(&ref::rope_forward) rope_fwd;
  decltype(&ref::rope_backward) rope_bwd;
  decltype(&ref::attention_forward) attn_fwd;
  decltype(&ref::attention_backward) attn_bwd;
};
const Kernels kRefKernels{ref::rmsnorm_forward, ref::rmsnorm_backward,  ref::rope_forward,
                          ref::rope_backward,   ref::attention_forward, ref::attention_backward};
const Kernels kCpuKernels{cpu::rmsnorm_forward, cpu::rmsnorm_backward,  cpu::rope_forward,
                          cpu::rope_backward,   cpu::attention_forward, cpu::attention_backward};

// The part of Qwen3MoeAttention between the q/k/v projections and o_proj.
struct Qwen3Core {
  Dims d;
  DType dt;
  Tensor q_raw, k_raw, v, wq_P, wk_P;  // inputs and the two norm weights
  Tensor cos_RP, sin_RP;
  static constexpr double kEps = 1e-6;

  Qwen3Core(Dims dims, DType dtype, Rng& rng) : d(dims), dt(dtype) {
    Inputs in = random_inputs(d, dt, rng);
    q_raw = in.q, k_raw = in.k, v = in.v;
    wq_P = random_tensor({d.P}, dt, rng, 0.5);
    wk_P = random_tensor({d.P}, dt, rng, 0.5);
    for (int64_t i = 0; i < d.P; ++i) {  // around HF's init of ones
      wq_P.set(i, 1 + wq_P.get(i));
      wk_P.set(i, 1 + wk_P.get(i));
    }
    std::vector<int32_t> pos;
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t t = 0; t < d.T; ++t) pos.push_back(int32_t(t + 3 * b));  // b 1 starts later
    cos_RP = Tensor::empty({d.B * d.T, d.P}, dt);
    sin_RP = Tensor::empty({d.B * d.T, d.P}, dt);
    ref::rope_tables(cos_RP, sin_RP, pos, 1e6);
  }

  struct Saved {
    Tensor rstd_q, rstd_k, q, k, lse, out;  // q, k after norm and RoPE
  };
  Saved forward(const Kernels& K) const {
    Saved s{Tensor::empty({d.B * d.T * d.Hq}, acc_dtype(dt)),
            Tensor::empty({d.B * d.T * d.Hkv}, acc_dtype(dt)),
            Tensor::empty(q_raw.shape(), dt),
            Tensor::empty(k_raw.shape(), dt),
            Tensor::empty({d.B, d.T, d.Hq}, acc_dtype(dt)),
            Tensor::empty(q_raw.shape(), dt)};
    K.norm_fwd(s.q, s.rstd_q, q_raw, wq_P, kEps, RmsNormCast::after_normalize);
    K.norm_fwd(s.k, s.rstd_k, k_raw, wk_P, kEps, RmsNormCast::after_normalize);
    K.rope_fwd(s.q, s.q, cos_RP, sin_RP);  // in place, as the model does
    K.rope_fwd(s.k, s.k, cos_RP, sin_RP);
    K.attn_fwd(s.out, s.lse, s.q, s.k, v, {});
    return s;
  }

  struct Grads {
    Tensor dq_raw, dk_raw, dv, dwq_P, dwk_P;
  };
  Grads backward(const Kernels& K, const Saved& s, const Tensor& dout) const {
    Grads g{Tensor::empty(q_raw.shape(), dt), Tensor::empty(k_raw.shape(), dt),
            Tensor::empty(v.shape(), dt), Tensor::empty({d.P}, acc_dtype(dt)),
            Tensor::empty({d.P}, acc_dtype(dt))};
    Tensor dq = Tensor::empty(q_raw.shape(), dt), dk = Tensor::empty(k_raw.shape(), dt);
    K.attn_bwd(dq, dk, g.dv, dout, s.q, s.k, v, s.out, s.lse, {}, false, nullptr);
    K.rope_bwd(dq, dq, cos_RP, sin_RP, false);
    K.rope_bwd(dk, dk, cos_RP, sin_RP, false);
    K.norm_bwd(g.dq_raw, g.dwq_P, dq, q_raw, wq_P, s.rstd_q, false, RmsNormCast::after_normalize);
    K.norm_bwd(g.dk_raw, g.dwk_P, dk, k_raw, wk_P, s.rstd_k, false, RmsNormCast::after_normalize);
    return g;
  }
};

}  // namespace

// Tolerances as for attention alone: the norms and RoPE add only rounding
// (RoPE is bitwise equal between the twins; the norms differ by ulps of their
// row sums), which the attention tolerances already cover. In bf16 the
// normalized q and k can themselves land a bf16 ulp apart (see
// test_rmsnorm.cpp), moving scores by ~2^-7 of their size, so bf16 gets the
// gradient tolerance for its output too.
TEST(Qwen3AttentionCore, CpuMatchesRef) {
  Rng rng(65);
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    Qwen3Core core(Dims{2, 9, 4, 2, 16}, dt, rng);
    Tensor dout = random_tensor(core.q_raw.shape(), dt, rng);
    auto s_ref = core.forward(kRefKernels), s_cpu = core.forward(kCpuKernels);
    auto g_ref = core.backward(kRefKernels, s_ref, dout);
    auto g_cpu = core.backward(kCpuKernels, s_cpu, dout);
    Tol ot = dt == DType::bf16 ? grad_tol(dt) : out_tol(dt), gt = grad_tol(dt);
    std::string what = " " + std::string(dtype_name(dt));
    EXPECT_TRUE(all_close(s_cpu.out, s_ref.out, ot.rtol, ot.atol, "out" + what));
    EXPECT_TRUE(all_close(g_cpu.dq_raw, g_ref.dq_raw, gt.rtol, gt.atol, "dq_raw" + what));
    EXPECT_TRUE(all_close(g_cpu.dk_raw, g_ref.dk_raw, gt.rtol, gt.atol, "dk_raw" + what));
    EXPECT_TRUE(all_close(g_cpu.dv, g_ref.dv, gt.rtol, gt.atol, "dv" + what));
    // dw sums over every row and head: its scale is sqrt(rows) larger.
    EXPECT_TRUE(all_close(g_cpu.dwq_P, g_ref.dwq_P, gt.rtol, gt.atol * 8, "dwq" + what));
    EXPECT_TRUE(all_close(g_cpu.dwk_P, g_ref.dwk_P, gt.rtol, gt.atol * 8, "dwk" + what));
  }
}

TEST(Qwen3AttentionCore, BackwardMatchesFiniteDifferences) {
  Rng rng(66);
  Qwen3Core core(Dims{2, 4, 4, 2, 6}, DType::f64, rng);
  Tensor r = random_tensor(core.q_raw.shape(), DType::f64, rng);
  for (const Kernels* K : {&kRefKernels, &kCpuKernels}) {
    auto loss = [&] { return weighted_sum(core.forward(*K).out, r); };
    auto g = core.backward(*K, core.forward(*K), r);
    std::string name = K == &kCpuKernels ? "cpu " : "ref ";
    EXPECT_TRUE(fd_check(loss, core.q_raw, g.dq_raw, name + "dq_raw", 1e-6, 1e-8, 48));
    EXPECT_TRUE(fd_check(loss, core.k_raw, g.dk_raw, name + "dk_raw", 1e-6, 1e-8, 48));
    EXPECT_TRUE(fd_check(loss, core.v, g.dv, name + "dv", 1e-6, 1e-8, 48));
    EXPECT_TRUE(fd_check(loss, core.wq_P, g.dwq_P, name + "dwq", 1e-6, 1e-8));
    EXPECT_TRUE(fd_check(loss, core.wk_P, g.dwk_P, name + "dwk", 1e-6, 1e-8));
  }
}

// Every output element is owned by one task and summed in a fixed order, so
// the thread count cannot change a bit.
TEST(Attention, CpuResultsDoNotDependOnThreadCount) {
  Rng rng(67);
  Dims d{2, 200, 4, 2, 32};  // large enough to be split across threads
  Inputs in = random_inputs(d, DType::bf16, rng);
  Tensor dout = random_tensor(in.q.shape(), DType::bf16, rng);
  std::vector<Tensor> results;
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    Tensor out = Tensor::empty(in.q.shape(), DType::bf16);
    Tensor lse = Tensor::empty({d.B, d.T, d.Hq}, DType::f32);
    Grads g = empty_grads(in);
    run(cpu::attention_forward, cpu::attention_backward, in, dout, out, lse, g);
    for (Tensor* t : {&out, &lse, &g.dq, &g.dk, &g.dv}) results.push_back(*t);
  }
  set_num_threads(0);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(bitwise_equal(results[i + 5], results[i], "result " + std::to_string(i)));
  }
}
