#include "tiermoe/moe/expert_math.h"

#include <algorithm>

#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/activation.h"
#include "tiermoe/kernels/matmul.h"
#include "tiermoe/kernels/matmul_mixed.h"

namespace tiermoe {

namespace {

// into += t, elementwise in the grad dtype (f32 or f64).
void add_into(Tensor& into, const Tensor& t) {
  check_shape(t, into.shape(), "gradient sum");
  check_dtype(t, into.dtype(), "gradient sum");
  auto run = [&]<class A>() {
    A* o = into.data<A>();
    const A* s = t.data<A>();
    parallel_for(into.numel(), 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] += s[i];
    });
  };
  if (into.dtype() == DType::f64) run.template operator()<double>();
  else run.template operator()<float>();
}

// The weight may be stored narrower than the activations (a frozen bf16
// checkpoint weight in an f32 run): the *_mixed products equal the plain ones
// on the widened weight, and are the plain ones when the dtypes agree.
void mm_forward(KernelSet k, Tensor& y, const Tensor& x, const Tensor& w) {
  if (k == KernelSet::ref) ref::matmul_forward_mixed(y, x, w);
  else cpu::matmul_forward_mixed(y, x, w);
}
void mm_backward_dx(KernelSet k, Tensor& dx, const Tensor& dy, const Tensor& w) {
  if (k == KernelSet::ref) ref::matmul_backward_dx_mixed(dx, dy, w);
  else cpu::matmul_backward_dx_mixed(dx, dy, w);
}

// sum_NK (+)= dy_MN^T . x_MK over the rows in blocks of `block` rows: the
// first block's product is written (unless `started`), each later one is
// computed into scratch and added, so the sum does not depend on whether the
// rows arrive in one call or one block per call.
void dw_blocked(KernelSet k, Tensor& sum_NK, const Tensor& dy_MN, const Tensor& x_MK,
                int64_t block, bool started) {
  const int64_t M = dy_MN.size(0);
  Tensor scratch;
  for (int64_t b = 0; b < M; b += block) {
    const int64_t e = std::min(M, b + block);
    const Tensor dy = dy_MN.rows(b, e), x = x_MK.rows(b, e);
    Tensor& out = (b == 0 && !started) ? sum_NK : scratch;
    if (&out == &scratch && !scratch.defined()) scratch = Tensor::empty(sum_NK.shape(), sum_NK.dtype());
    if (k == KernelSet::ref) ref::matmul_backward_dw(out, dy, x);
    else cpu::matmul_backward_dw(out, dy, x);
    if (&out == &scratch) add_into(sum_NK, scratch);
  }
}

}  // namespace

ExpertGrads ExpertGrads::empty(const ExpertsConfig& cfg, DType g, MemTag tag) {
  const int64_t D = cfg.hidden, F = cfg.ffn;
  ExpertGrads s;
  s.dw13_FD = Tensor::empty({2 * F, D}, g, tag);
  s.dw2_DF = Tensor::empty({D, F}, g, tag);
  if (cfg.bias) {
    s.db13_F = Tensor::empty({2 * F}, g, tag);
    s.db2_D = Tensor::empty({D}, g, tag);
  }
  if (cfg.post_norm) s.dnorm_D = Tensor::empty({D}, g, tag);
  return s;
}

void ExpertGrads::add(const ExpertGrads& sum) {
  for (auto [into, s] : {std::pair{&dw13_FD, &sum.dw13_FD}, {&dw2_DF, &sum.dw2_DF},
                         {&db13_F, &sum.db13_F}, {&db2_D, &sum.db2_D},
                         {&dnorm_D, &sum.dnorm_D}}) {
    if (into->defined() && s->defined()) add_into(*into, *s);
  }
}

void expert_forward(const ExpertMath& m, Tensor& y_MD, ExpertRowsActs& acts, const Tensor& x_MD,
                    const Tensor& score_M) {
  if (x_MD.size(0) == 0) return;
  expert_w13_forward(m, acts, x_MD);
  expert_act_forward(m, acts.a_MF, acts.h_M2F);
  expert_w2_forward(m, y_MD, acts, score_M);
}

void expert_w13_forward(const ExpertMath& m, ExpertRowsActs& acts, const Tensor& x_MD) {
  if (x_MD.size(0) == 0) return;
  mm_forward(m.cfg->kernels, acts.h_M2F, x_MD, m.w.w13_FD);
  if (m.cfg->bias) add_bias_forward(acts.h_M2F, m.w.b13_F, Tensor());
  if (m.adapts(ExpertLinear::gate)) {
    m.adapter->forward_rows(ExpertLinear::gate, m.expert, acts.h_M2F, acts.lora_gate_MR, x_MD);
  }
  if (m.adapts(ExpertLinear::up)) {
    m.adapter->forward_rows(ExpertLinear::up, m.expert, acts.h_M2F, acts.lora_up_MR, x_MD);
  }
}

void expert_act_forward(const ExpertMath& m, Tensor& a_MF, const Tensor& h_M2F) {
  if (h_M2F.size(0) == 0) return;
  if (m.cfg->activation == ExpertActivation::gpt_oss) {
    gpt_oss_glu_forward(a_MF, h_M2F, m.cfg->gpt_oss);
  } else if (m.cfg->kernels == KernelSet::ref) {
    ref::swiglu_forward(a_MF, h_M2F);
  } else {
    cpu::swiglu_forward(a_MF, h_M2F);
  }
}

void expert_w2_forward(const ExpertMath& m, Tensor& y_MD, ExpertRowsActs& acts,
                       const Tensor& score_M) {
  const ExpertsConfig& cfg = *m.cfg;
  const int64_t M = acts.a_MF.size(0), F = cfg.ffn, D = cfg.hidden;
  if (M == 0) return;
  Tensor w2_in = acts.a_MF;
  if (score_M.defined()) {
    w2_in = Tensor::empty({M, F}, m.dtype);
    scale_rows_forward(w2_in, acts.a_MF, score_M);
  }
  Tensor& w2_out = cfg.post_norm ? acts.ypre_MD : y_MD;
  TIERMOE_ASSERT(w2_out.defined() && w2_out.size(0) == M && w2_out.size(1) == D);
  mm_forward(cfg.kernels, w2_out, w2_in, m.w.w2_DF);
  if (cfg.bias) add_bias_forward(w2_out, m.w.b2_D, score_M);
  if (m.adapts(ExpertLinear::down)) {
    m.adapter->forward_rows(ExpertLinear::down, m.expert, w2_out, acts.lora_down_MR, w2_in);
  }
  if (cfg.post_norm) rmsnorm_rows_forward(y_MD, acts.rstd_M, w2_out, m.w.norm_D, cfg.norm_eps);
}

namespace {

// A [D] (or [2F]) gradient sum to continue, to start from zero, or scratch
// when only dx is wanted (frozen experts).
Tensor vec_sum(Tensor* s, bool weight_grads, bool sum_started, int64_t n, DType g) {
  if (!weight_grads) return Tensor::zeros({n}, g);
  if (!sum_started) s->zero();
  return *s;
}

}  // namespace

Tensor expert_backward_w2_side(const ExpertMath& m, Tensor& dscore_M, const Tensor& dy_MD,
                               const ExpertRowsActs& acts, const Tensor& score_M, ExpertGrads* sum,
                               bool sum_started, bool want_w2_in) {
  const ExpertsConfig& cfg = *m.cfg;
  const int64_t M = dy_MD.size(0), F = cfg.ffn, D = cfg.hidden;
  const bool absorbed = score_M.defined();
  const bool weight_grads = sum && sum->defined();
  if (absorbed) dscore_M.zero();
  if (cfg.bias) {
    Tensor db2 = vec_sum(weight_grads ? &sum->db2_D : nullptr, weight_grads, sum_started, D,
                         m.grad_dtype());
    add_bias_backward(db2, dscore_M, dy_MD, m.w.b2_D, score_M);
  }
  // W2 saw the scaled activation; rebuild it from the unscaled one and the
  // score with the forward's exact arithmetic instead of keeping it.
  Tensor w2_in = acts.a_MF;
  if (absorbed && (weight_grads || want_w2_in)) {
    w2_in = Tensor::empty({M, F}, m.dtype);
    scale_rows_forward(w2_in, acts.a_MF, score_M);
  }
  if (weight_grads) {
    dw_blocked(cfg.kernels, sum->dw2_DF, dy_MD, w2_in, cfg.dw_row_block, sum_started);
  }
  return w2_in;
}

void expert_backward_w13_side(const ExpertMath& m, Tensor& dh_M2F, Tensor& dscore_M, Tensor& da_MF,
                              const ExpertRowsActs& acts, const Tensor& score_M, ExpertGrads* sum,
                              bool sum_started) {
  const ExpertsConfig& cfg = *m.cfg;
  const bool weight_grads = sum && sum->defined();
  if (score_M.defined()) {
    scale_rows_backward(da_MF, dscore_M, da_MF, acts.a_MF, score_M, /*accumulate=*/true);
  }
  if (cfg.activation == ExpertActivation::gpt_oss) {
    gpt_oss_glu_backward(dh_M2F, da_MF, acts.h_M2F, cfg.gpt_oss);
  } else if (cfg.kernels == KernelSet::ref) {
    ref::swiglu_backward(dh_M2F, da_MF, acts.h_M2F);
  } else {
    cpu::swiglu_backward(dh_M2F, da_MF, acts.h_M2F);
  }
  if (!weight_grads) return;
  if (cfg.bias) {
    Tensor db13 = vec_sum(&sum->db13_F, true, sum_started, 2 * cfg.ffn, m.grad_dtype()), none;
    add_bias_backward(db13, none, dh_M2F, m.w.b13_F, Tensor());
  }
  dw_blocked(cfg.kernels, sum->dw13_FD, dh_M2F, acts.x_MD, cfg.dw_row_block, sum_started);
}

void expert_backward(const ExpertMath& m, Tensor& dx_MD, Tensor& dscore_M, const Tensor& dy_MD,
                     const ExpertRowsActs& acts, const Tensor& score_M, ExpertGrads* sum,
                     bool sum_started) {
  const ExpertsConfig& cfg = *m.cfg;
  const int64_t M = dy_MD.size(0), F = cfg.ffn, D = cfg.hidden;
  if (M == 0) return;
  const bool absorbed = score_M.defined();
  const bool weight_grads = sum && sum->defined();
  const std::string where = "expert " + std::to_string(m.expert);
  TIERMOE_CHECK(!weight_grads || acts.x_MD.defined(),
                "weight gradients need the expert inputs x_ND, which forward did not keep", where,
                "run forward with weight_grads = true");
  TIERMOE_CHECK(!(weight_grads || absorbed) || acts.a_MF.defined(),
                "this backward needs the activation a_NF, which forward did not keep", where,
                "keep a_NF (or rebuild it by replay) for weight grads or absorbed scores");
  const bool lora_w13 = acts.lora_gate_MR.defined() || acts.lora_up_MR.defined();
  const bool lora_down = acts.lora_down_MR.defined();
  TIERMOE_CHECK(!lora_w13 || acts.x_MD.defined(),
                "the gate/up adapters' backward needs the expert inputs x_ND", where,
                "keep x_ND (or rebuild it by replay) when the experts carry gate/up adapters");
  TIERMOE_CHECK(!lora_down || acts.a_MF.defined(),
                "the down adapter's backward needs the activation a_NF", where,
                "keep a_NF (or rebuild it by replay) when the experts carry a down adapter");

  Tensor dy = dy_MD;
  if (cfg.post_norm) {
    dy = Tensor::empty({M, D}, m.dtype);
    Tensor dnorm = vec_sum(weight_grads ? &sum->dnorm_D : nullptr, weight_grads, sum_started, D,
                           m.grad_dtype());
    rmsnorm_rows_backward(dy, dnorm, dy_MD, acts.ypre_MD, m.w.norm_D, acts.rstd_M);
  }
  const Tensor w2_in =
      expert_backward_w2_side(m, dscore_M, dy, acts, score_M, sum, sum_started, lora_down);
  Tensor da = Tensor::empty({M, F}, m.dtype);
  mm_backward_dx(cfg.kernels, da, dy, m.w.w2_DF);
  if (lora_down) {
    m.adapter->backward_rows(ExpertLinear::down, m.expert, da, dy, w2_in, acts.lora_down_MR);
  }
  Tensor dh = Tensor::empty({M, 2 * F}, m.dtype);
  expert_backward_w13_side(m, dh, dscore_M, da, acts, score_M, sum, sum_started);
  mm_backward_dx(cfg.kernels, dx_MD, dh, m.w.w13_FD);
  if (acts.lora_gate_MR.defined()) {
    m.adapter->backward_rows(ExpertLinear::gate, m.expert, dx_MD, dh, acts.x_MD, acts.lora_gate_MR);
  }
  if (acts.lora_up_MR.defined()) {
    m.adapter->backward_rows(ExpertLinear::up, m.expert, dx_MD, dh, acts.x_MD, acts.lora_up_MR);
  }
}

}  // namespace tiermoe
