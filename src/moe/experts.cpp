#include "tiermoe/moe/experts.h"

#include "tiermoe/moe/expert_kernels.h"
#include "tiermoe/moe/expert_math.h"

#include <utility>

namespace tiermoe {


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
  TIERMOE_CHECK(dw_row_block >= 1, "dw_row_block must be >= 1", std::string(where),
                "the default is 512 rows");
  TIERMOE_CHECK(!(post_norm && norm_eps <= 0), "post_norm needs norm_eps > 0", std::string(where),
                "use e.g. 1e-6");
  TIERMOE_CHECK(activation != ExpertActivation::gpt_oss || gpt_oss.limit > 0,
                "gpt_oss activation needs a positive limit", std::string(where),
                "GPT-OSS uses swiglu_limit 7.0");
}

GroupedExperts::GroupedExperts(ExpertsConfig cfg, DType dtype, std::string name,
                               bool unbound_weights)
    : cfg_(cfg), dtype_(dtype), name_(std::move(name)), packs_(std::make_shared<ExpertPacks>()) {
  cfg_.validate(name_);
  const int64_t E = cfg_.num_experts, D = cfg_.hidden, F = cfg_.ffn;
  if (unbound_weights) {
    // Shape only (no memory) until bound: a placeholder must never be read.
    w13_EFD = Tensor::from_external(nullptr, {E, 2 * F, D}, dtype, nullptr);
    w2_EDF = Tensor::from_external(nullptr, {E, D, F}, dtype, nullptr);
  } else {
    w13_EFD = Tensor::zeros({E, 2 * F, D}, dtype, MemTag::weights);
    w2_EDF = Tensor::zeros({E, D, F}, dtype, MemTag::weights);
  }
  if (cfg_.bias) {
    b13_E2F = Tensor::zeros({E, 2 * F}, dtype, MemTag::weights);
    b2_ED = Tensor::zeros({E, D}, dtype, MemTag::weights);
  }
  if (cfg_.post_norm) {
    norm_ED = Tensor::zeros({E, D}, dtype, MemTag::weights);
    norm_ED.fill(1.0);
  }
}

namespace {

void check_bound_weight(const Tensor& t, const Shape& want, DType compute, const char* what,
                        const std::string& where) {
  check_shape(t, want, what);
  TIERMOE_CHECK(t.dtype() == compute || (t.dtype() == DType::bf16 && compute != DType::bf16) ||
                    (t.dtype() == DType::f32 && compute == DType::f64),
                detail::str_of(what, " is ", dtype_name(t.dtype()), ", wider than the experts' ",
                               dtype_name(compute)),
                where, "bind weights stored no wider than the compute dtype");
}

}  // namespace

void GroupedExperts::bind_weights(Tensor w13, Tensor w2) {
  const int64_t E = cfg_.num_experts, D = cfg_.hidden, F = cfg_.ffn;
  check_bound_weight(w13, {E, 2 * F, D}, dtype_, "w13_EFD", name_);
  check_bound_weight(w2, {E, D, F}, dtype_, "w2_EDF", name_);
  w13_EFD = std::move(w13);
  w2_EDF = std::move(w2);
  w13_e_.clear();
  w2_e_.clear();
  q13_.clear();
  q2_.clear();
}

void GroupedExperts::bind_expert_weights(int64_t e, Tensor w13, Tensor w2) {
  const int64_t E = cfg_.num_experts, D = cfg_.hidden, F = cfg_.ffn;
  TIERMOE_ASSERT(e >= 0 && e < E, "expert ", e, " of ", E);
  check_bound_weight(w13, {2 * F, D}, dtype_, "w13_FD", name_);
  check_bound_weight(w2, {D, F}, dtype_, "w2_DF", name_);
  if (w13_e_.empty()) {
    w13_e_.resize(size_t(E));
    w2_e_.resize(size_t(E));
    // The stacked tensors keep only their shape from here on.
    w13_EFD = Tensor::from_external(nullptr, w13_EFD.shape(), dtype_, nullptr);
    w2_EDF = Tensor::from_external(nullptr, w2_EDF.shape(), dtype_, nullptr);
  }
  w13_e_[size_t(e)] = std::move(w13);
  w2_e_[size_t(e)] = std::move(w2);
  if (quantized()) {
    // Widened weights replace quantized ones: every expert must be bound
    // again (the others keep placeholders until then).
    q13_.clear();
    q2_.clear();
  }
  weights_changed();
}

void GroupedExperts::bind_quantized_weights(std::vector<QuantMatrix> w13, std::vector<QuantMatrix> w2) {
  const int64_t E = cfg_.num_experts, D = cfg_.hidden, F = cfg_.ffn;
  TIERMOE_CHECK(int64_t(w13.size()) == E && int64_t(w2.size()) == E,
                detail::str_of("bind_quantized_weights got ", w13.size(), " W13 and ", w2.size(),
                               " W2 matrices for ", E, " experts"),
                name_, "pass one quantized W13 [2F, D] and W2 [D, F] per expert");
  for (int64_t e = 0; e < E; ++e) {
    const std::string at = detail::str_of(name_, " expert ", e);
    check_quant_matrix(w13[size_t(e)], at + " w13");
    check_quant_matrix(w2[size_t(e)], at + " w2");
    TIERMOE_CHECK(w13[size_t(e)].rows == 2 * F && w13[size_t(e)].cols == D &&
                      w2[size_t(e)].rows == D && w2[size_t(e)].cols == F,
                  detail::str_of("expert ", e, "'s quantized W13 is [", w13[size_t(e)].rows, ", ",
                                 w13[size_t(e)].cols, "] and W2 [", w2[size_t(e)].rows, ", ",
                                 w2[size_t(e)].cols, "]; the experts need [", 2 * F, ", ", D,
                                 "] and [", D, ", ", F, "]"),
                  name_, "quantize the experts' own W13 (gate rows, then up) and W2");
    TIERMOE_CHECK(quant_layout(w13[size_t(e)]) == quant_layout(w13[0]) &&
                      quant_layout(w2[size_t(e)]) == quant_layout(w2[0]),
                  detail::str_of("expert ", e, "'s quantized W13 and W2 are ",
                                 quant_layout(w13[size_t(e)]).str(), " and ",
                                 quant_layout(w2[size_t(e)]).str(), ", expert 0's ",
                                 quant_layout(w13[0]).str(), " and ", quant_layout(w2[0]).str()),
                  name_, "a layer's experts share one format, group and scale layout");
  }
  TIERMOE_CHECK(!cfg_.post_norm, "quantized experts with a post-norm are not supported", name_,
                "keep these experts in the compute dtype");
  q13_ = std::move(w13);
  q2_ = std::move(w2);
  w13_e_.clear();
  w2_e_.clear();
  // The widened stacks keep only their shape (the gradients' shapes).
  w13_EFD = Tensor::from_external(nullptr, {E, 2 * F, D}, dtype_, nullptr);
  w2_EDF = Tensor::from_external(nullptr, {E, D, F}, dtype_, nullptr);
  weights_changed();
}

std::string ExpertQuant::str() const { return "w13 " + w13.str() + ", w2 " + w2.str(); }

std::optional<ExpertQuant> GroupedExperts::quant() const {
  if (!quantized()) return std::nullopt;
  return ExpertQuant{quant_layout(q13_[0]), quant_layout(q2_[0])};
}

int64_t GroupedExperts::weight_bytes() const {
  int64_t n = 0;
  if (quantized()) {
    for (size_t e = 0; e < q13_.size(); ++e) n += q13_[e].bytes() + q2_[e].bytes();
  } else if (weights_per_expert()) {
    for (size_t e = 0; e < w13_e_.size(); ++e) n += int64_t(w13_e_[e].nbytes() + w2_e_[e].nbytes());
  } else if (w13_EFD.raw()) {
    n = int64_t(w13_EFD.nbytes() + w2_EDF.nbytes());
  }
  return n;
}

void GroupedExperts::allocate_grads() {
  if (has_grads()) return;
  const DType g = grad_dtype();
  // The stacked shapes: w13_EFD may be a bound or per-expert placeholder.
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

void GroupedExperts::set_adapter(ExpertAdapter* adapter) { adapter_ = adapter; }

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
  weights_changed();
  return const_cast<Tensor&>(std::as_const(*this).param(name));
}

const Tensor& GroupedExperts::param(std::string_view name) const {
  TIERMOE_CHECK(!(quantized() && (name == "w13" || name == "w2")),
                "'" + std::string(name) + "' is stored quantized (" +
                    std::string(quant_format_name(q13_[0].format)) + ") and frozen",
                name_, "read expert e's dequantized weights through weights(e); train LoRA on them");
  TIERMOE_CHECK(!(weights_per_expert() && (name == "w13" || name == "w2")),
                "'" + std::string(name) + "' is bound one expert at a time", name_,
                "read expert e's weights through weights(e)");
  if (name == "w13") return w13_EFD;
  if (name == "w2") return w2_EDF;
  if (name == "b13" && cfg_.bias) return b13_E2F;
  if (name == "b2" && cfg_.bias) return b2_ED;
  if (name == "norm" && cfg_.post_norm) return norm_ED;
  throw Error("no parameter '" + std::string(name) + "'", name_,
              "expert parameters are w13, w2 (+ b13, b2 with bias, norm with post_norm)");
}

const Tensor& GroupedExperts::param_or_placeholder(std::string_view name) const {
  if (quantized() && name == "w13") return w13_EFD;
  if (quantized() && name == "w2") return w2_EDF;
  return param(name);
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

bool GroupedExperts::weights_bound(int64_t e) const {
  if (quantized()) return true;
  return weights_per_expert() ? w13_e_[size_t(e)].defined() : w13_EFD.raw() != nullptr;
}

ExpertWeights GroupedExperts::weights(int64_t e) const {
  ExpertWeights w;
  if (quantized()) {
    w.w13_FD = dequantize(q13_[size_t(e)], dtype_);
    w.w2_DF = dequantize(q2_[size_t(e)], dtype_);
  } else if (weights_per_expert()) {
    w.w13_FD = w13_e_[size_t(e)];
    w.w2_DF = w2_e_[size_t(e)];
  } else {
    w.w13_FD = w13_EFD.select(e);
    w.w2_DF = w2_EDF.select(e);
  }
  if (cfg_.bias) {
    w.b13_F = b13_E2F.select(e);
    w.b2_D = b2_ED.select(e);
  }
  if (cfg_.post_norm) w.norm_D = norm_ED.select(e);
  return w;
}

ExpertGrads GroupedExperts::grads(int64_t e) {
  allocate_grads();
  ExpertGrads g;
  g.dw13_FD = dw13_EFD.select(e);
  g.dw2_DF = dw2_EDF.select(e);
  if (cfg_.bias) {
    g.db13_F = db13_E2F.select(e);
    g.db2_D = db2_ED.select(e);
  }
  if (cfg_.post_norm) g.dnorm_D = dnorm_ED.select(e);
  return g;
}

ExpertMath GroupedExperts::math(int64_t e) const {
  return ExpertMath{&cfg_, dtype_, weights(e), adapter_, e};
}

ExpertMath GroupedExperts::math_without_matrices(int64_t e) const {
  ExpertWeights w;
  if (cfg_.bias) {
    w.b13_F = b13_E2F.select(e);
    w.b2_D = b2_ED.select(e);
  }
  if (cfg_.post_norm) w.norm_D = norm_ED.select(e);
  return ExpertMath{&cfg_, dtype_, w, adapter_, e};
}

void GroupedExperts::forward_rows(int64_t e, Tensor& y_MD, ExpertRowsActs& acts,
                                  const Tensor& x_MD, const Tensor& score_M) const {
  expert_forward(math(e), y_MD, acts, x_MD, score_M);
}

void GroupedExperts::w13_forward_rows(int64_t e, ExpertRowsActs& acts, const Tensor& x_MD) const {
  expert_w13_forward(math(e), acts, x_MD);
}

void GroupedExperts::act_forward_rows(Tensor& a_MF, const Tensor& h_M2F) const {
  expert_act_forward(math_without_matrices(0), a_MF, h_M2F);
}

void GroupedExperts::w2_forward_rows(int64_t e, Tensor& y_MD, ExpertRowsActs& acts,
                                     const Tensor& score_M) const {
  expert_w2_forward(math(e), y_MD, acts, score_M);
}

void GroupedExperts::backward_rows(int64_t e, Tensor& dx_MD, Tensor& dscore_M, const Tensor& dy_MD,
                                   const ExpertRowsActs& acts, const Tensor& score_M,
                                   bool weight_grads) {
  if (dy_MD.size(0) == 0) return;
  TIERMOE_ASSERT(!weight_grads || has_grads(), "allocate_grads() before a parallel backward");
  if (!weight_grads) {
    expert_backward(math(e), dx_MD, dscore_M, dy_MD, acts, score_M, nullptr, false);
    return;
  }
  // This call's sum, added once to the accumulated grads (expert_math.h).
  ExpertGrads sum = ExpertGrads::empty(cfg_, grad_dtype());
  expert_backward(math(e), dx_MD, dscore_M, dy_MD, acts, score_M, &sum, false);
  grads(e).add(sum);
}

}  // namespace tiermoe
