#include "tiermoe/moe/experts.h"

#include "tiermoe/kernels/activation.h"
#include "tiermoe/kernels/matmul.h"

#include <utility>

namespace tiermoe {

namespace {

void mm_forward(KernelSet k, Tensor& y, const Tensor& x, const Tensor& w) {
  if (k == KernelSet::ref) ref::matmul_forward(y, x, w);
  else cpu::matmul_forward(y, x, w);
}
void mm_backward_dx(KernelSet k, Tensor& dx, const Tensor& dy, const Tensor& w) {
  if (k == KernelSet::ref) ref::matmul_backward_dx(dx, dy, w);
  else cpu::matmul_backward_dx(dx, dy, w);
}
void mm_backward_dw_acc(KernelSet k, Tensor& dw, const Tensor& dy, const Tensor& x) {
  if (k == KernelSet::ref) ref::matmul_backward_dw(dw, dy, x, /*accumulate=*/true);
  else cpu::matmul_backward_dw(dw, dy, x, /*accumulate=*/true);
}

}  // namespace

std::string_view expert_activation_name(ExpertActivation a) {
  switch (a) {
    case ExpertActivation::swiglu: return "swiglu";
    case ExpertActivation::gpt_oss: return "gpt_oss";
  }
  __builtin_unreachable();
}

void ExpertsConfig::validate(std::string_view where) const {
  TIERMOE_CHECK(num_experts >= 1 && hidden >= 1 && ffn >= 1,
                detail::str_of("experts need E, D, F >= 1, got E ", num_experts, ", D ", hidden,
                               ", F ", ffn),
                std::string(where), "set num_experts, hidden and ffn");
  TIERMOE_CHECK(!(post_norm && norm_eps <= 0), "post_norm needs norm_eps > 0", std::string(where),
                "use e.g. 1e-6");
  TIERMOE_CHECK(activation != ExpertActivation::gpt_oss || gpt_oss.limit > 0,
                "gpt_oss activation needs a positive limit", std::string(where),
                "GPT-OSS uses swiglu_limit 7.0");
}

GroupedExperts::GroupedExperts(ExpertsConfig cfg, DType dtype, std::string name)
    : cfg_(cfg), dtype_(dtype), name_(std::move(name)) {
  cfg_.validate(name_);
  const int64_t E = cfg_.num_experts, D = cfg_.hidden, F = cfg_.ffn;
  w13_EFD = Tensor::zeros({E, 2 * F, D}, dtype, MemTag::weights);
  w2_EDF = Tensor::zeros({E, D, F}, dtype, MemTag::weights);
  if (cfg_.bias) {
    b13_E2F = Tensor::zeros({E, 2 * F}, dtype, MemTag::weights);
    b2_ED = Tensor::zeros({E, D}, dtype, MemTag::weights);
  }
  if (cfg_.post_norm) {
    norm_ED = Tensor::zeros({E, D}, dtype, MemTag::weights);
    norm_ED.fill(1.0);
  }
}

void GroupedExperts::allocate_grads() {
  if (has_grads()) return;
  const DType g = grad_dtype();
  dw13_EFD = Tensor::zeros(w13_EFD.shape(), g, MemTag::grads);
  dw2_EDF = Tensor::zeros(w2_EDF.shape(), g, MemTag::grads);
  if (cfg_.bias) {
    db13_E2F = Tensor::zeros(b13_E2F.shape(), g, MemTag::grads);
    db2_ED = Tensor::zeros(b2_ED.shape(), g, MemTag::grads);
  }
  if (cfg_.post_norm) dnorm_ED = Tensor::zeros(norm_ED.shape(), g, MemTag::grads);
}

void GroupedExperts::free_grads() {
  dw13_EFD = dw2_EDF = db13_E2F = db2_ED = dnorm_ED = Tensor();
}

void GroupedExperts::set_adapter(ExpertAdapter* adapter) {
  TIERMOE_CHECK(!adapter || cfg_.activation == ExpertActivation::swiglu,
                "LoRA on gpt_oss experts is not supported", name_,
                "adapters assume the swiglu layout (gate rows, then up rows)");
  adapter_ = adapter;
}

DType GroupedExperts::grad_dtype() const {
  return dtype_ == DType::f64 ? DType::f64 : DType::f32;
}

std::vector<std::string> GroupedExperts::param_names() const {
  std::vector<std::string> names{"w13", "w2"};
  if (cfg_.bias) names.insert(names.end(), {"b13", "b2"});
  if (cfg_.post_norm) names.push_back("norm");
  return names;
}

Tensor& GroupedExperts::param(std::string_view name) {
  return const_cast<Tensor&>(std::as_const(*this).param(name));
}

const Tensor& GroupedExperts::param(std::string_view name) const {
  if (name == "w13") return w13_EFD;
  if (name == "w2") return w2_EDF;
  if (name == "b13" && cfg_.bias) return b13_E2F;
  if (name == "b2" && cfg_.bias) return b2_ED;
  if (name == "norm" && cfg_.post_norm) return norm_ED;
  throw Error("no parameter '" + std::string(name) + "'", name_,
              "expert parameters are w13, w2 (+ b13, b2 with bias, norm with post_norm)");
}

Tensor& GroupedExperts::grad(std::string_view name) {
  allocate_grads();
  return const_cast<Tensor&>(std::as_const(*this).grad(name));
}

const Tensor& GroupedExperts::grad(std::string_view name) const {
  const Tensor& p = param(name);  // validates the name
  TIERMOE_CHECK(has_grads(), "gradient '" + std::string(name) + "' read before any backward",
                name_, "run a backward with weight gradients, or call allocate_grads()");
  if (&p == &w13_EFD) return dw13_EFD;
  if (&p == &w2_EDF) return dw2_EDF;
  if (&p == &b13_E2F) return db13_E2F;
  if (&p == &b2_ED) return db2_ED;
  return dnorm_ED;
}

void GroupedExperts::zero_grad() {
  if (!has_grads()) return;
  for (const auto& n : param_names()) grad(n).zero();
}

void GroupedExperts::forward_rows(int64_t e, Tensor& y_MD, ExpertRowsActs& acts,
                                  const Tensor& x_MD, const Tensor& score_M) const {
  if (x_MD.size(0) == 0) return;
  w13_forward_rows(e, acts, x_MD);
  act_forward_rows(acts.a_MF, acts.h_M2F);
  w2_forward_rows(e, y_MD, acts, score_M);
}

void GroupedExperts::w13_forward_rows(int64_t e, ExpertRowsActs& acts, const Tensor& x_MD) const {
  if (x_MD.size(0) == 0) return;
  mm_forward(cfg_.kernels, acts.h_M2F, x_MD, w13_EFD.select(e));
  if (cfg_.bias) add_bias_forward(acts.h_M2F, b13_E2F.select(e), Tensor());
  if (adapts(ExpertLinear::gate)) {
    adapter_->forward_rows(ExpertLinear::gate, e, acts.h_M2F, acts.lora_gate_MR, x_MD);
  }
  if (adapts(ExpertLinear::up)) {
    adapter_->forward_rows(ExpertLinear::up, e, acts.h_M2F, acts.lora_up_MR, x_MD);
  }
}

void GroupedExperts::act_forward_rows(Tensor& a_MF, const Tensor& h_M2F) const {
  if (h_M2F.size(0) == 0) return;
  if (cfg_.activation == ExpertActivation::gpt_oss) {
    gpt_oss_glu_forward(a_MF, h_M2F, cfg_.gpt_oss);
  } else if (cfg_.kernels == KernelSet::ref) {
    ref::swiglu_forward(a_MF, h_M2F);
  } else {
    cpu::swiglu_forward(a_MF, h_M2F);
  }
}

void GroupedExperts::w2_forward_rows(int64_t e, Tensor& y_MD, ExpertRowsActs& acts,
                                     const Tensor& score_M) const {
  const int64_t M = acts.a_MF.size(0), F = cfg_.ffn, D = cfg_.hidden;
  if (M == 0) return;
  Tensor w2_in = acts.a_MF;
  if (score_M.defined()) {
    w2_in = Tensor::empty({M, F}, dtype_);
    scale_rows_forward(w2_in, acts.a_MF, score_M);
  }
  Tensor& w2_out = cfg_.post_norm ? acts.ypre_MD : y_MD;
  TIERMOE_ASSERT(w2_out.defined() && w2_out.size(0) == M && w2_out.size(1) == D);
  mm_forward(cfg_.kernels, w2_out, w2_in, w2_EDF.select(e));
  if (cfg_.bias) add_bias_forward(w2_out, b2_ED.select(e), score_M);
  if (adapts(ExpertLinear::down)) {
    adapter_->forward_rows(ExpertLinear::down, e, w2_out, acts.lora_down_MR, w2_in);
  }
  if (cfg_.post_norm) {
    rmsnorm_rows_forward(y_MD, acts.rstd_M, w2_out, norm_ED.select(e), cfg_.norm_eps);
  }
}

void GroupedExperts::backward_rows(int64_t e, Tensor& dx_MD, Tensor& dscore_M, const Tensor& dy_MD,
                                   const ExpertRowsActs& acts, const Tensor& score_M,
                                   bool weight_grads) {
  const int64_t M = dy_MD.size(0), F = cfg_.ffn, D = cfg_.hidden;
  if (M == 0) return;
  const bool absorbed = score_M.defined();
  TIERMOE_ASSERT(!weight_grads || has_grads(), "allocate_grads() before a parallel backward");
  TIERMOE_CHECK(!weight_grads || acts.x_MD.defined(),
                "weight gradients need the expert inputs x_ND, which forward did not keep", name_,
                "run forward with weight_grads = true");
  TIERMOE_CHECK(!(weight_grads || absorbed) || acts.a_MF.defined(),
                "this backward needs the activation a_NF, which forward did not keep", name_,
                "keep a_NF (or rebuild it by replay) for weight grads or absorbed scores");
  const bool lora_w13 = acts.lora_gate_MR.defined() || acts.lora_up_MR.defined();
  const bool lora_down = acts.lora_down_MR.defined();
  TIERMOE_CHECK(!lora_w13 || acts.x_MD.defined(),
                "the gate/up adapters' backward needs the expert inputs x_ND", name_,
                "keep x_ND (or rebuild it by replay) when the experts carry gate/up adapters");
  TIERMOE_CHECK(!lora_down || acts.a_MF.defined(),
                "the down adapter's backward needs the activation a_NF", name_,
                "keep a_NF (or rebuild it by replay) when the experts carry a down adapter");
  // Parameter grads of a [D] row go to scratch when only dx is wanted (frozen experts).
  auto grad_or_scratch = [&](const Tensor& g_ED) {
    return weight_grads ? g_ED.select(e) : Tensor::zeros({D}, grad_dtype());
  };

  Tensor dy = dy_MD;
  if (cfg_.post_norm) {
    dy = Tensor::empty({M, D}, dtype_);
    Tensor dnorm = grad_or_scratch(dnorm_ED);
    rmsnorm_rows_backward(dy, dnorm, dy_MD, acts.ypre_MD, norm_ED.select(e), acts.rstd_M);
  }
  if (absorbed) dscore_M.zero();
  if (cfg_.bias) {
    Tensor db2 = grad_or_scratch(db2_ED);
    add_bias_backward(db2, dscore_M, dy, b2_ED.select(e), score_M);
  }
  // W2 saw the scaled activation; rebuild it from the unscaled one and the
  // score with the forward's exact arithmetic instead of keeping it.
  Tensor w2_in = acts.a_MF;
  if (absorbed && (weight_grads || lora_down)) {
    w2_in = Tensor::empty({M, F}, dtype_);
    scale_rows_forward(w2_in, acts.a_MF, score_M);
  }
  if (weight_grads) {
    Tensor dw2 = dw2_EDF.select(e);
    mm_backward_dw_acc(cfg_.kernels, dw2, dy, w2_in);
  }
  Tensor da = Tensor::empty({M, F}, dtype_);
  mm_backward_dx(cfg_.kernels, da, dy, w2_EDF.select(e));
  if (lora_down) adapter_->backward_rows(ExpertLinear::down, e, da, dy, w2_in, acts.lora_down_MR);
  if (absorbed) scale_rows_backward(da, dscore_M, da, acts.a_MF, score_M, /*accumulate=*/true);

  Tensor dh = Tensor::empty({M, 2 * F}, dtype_);
  if (cfg_.activation == ExpertActivation::gpt_oss) {
    gpt_oss_glu_backward(dh, da, acts.h_M2F, cfg_.gpt_oss);
  } else if (cfg_.kernels == KernelSet::ref) {
    ref::swiglu_backward(dh, da, acts.h_M2F);
  } else {
    cpu::swiglu_backward(dh, da, acts.h_M2F);
  }
  if (weight_grads) {
    if (cfg_.bias) {
      Tensor db13 = db13_E2F.select(e), none;
      add_bias_backward(db13, none, dh, b13_E2F.select(e), Tensor());
    }
    Tensor dw13 = dw13_EFD.select(e);
    mm_backward_dw_acc(cfg_.kernels, dw13, dh, acts.x_MD);
  }
  mm_backward_dx(cfg_.kernels, dx_MD, dh, w13_EFD.select(e));
  if (acts.lora_gate_MR.defined()) {
    adapter_->backward_rows(ExpertLinear::gate, e, dx_MD, dh, acts.x_MD, acts.lora_gate_MR);
  }
  if (acts.lora_up_MR.defined()) {
    adapter_->backward_rows(ExpertLinear::up, e, dx_MD, dh, acts.x_MD, acts.lora_up_MR);
  }
}

}  // namespace tiermoe
