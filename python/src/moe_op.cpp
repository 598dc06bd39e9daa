#include "moe_op.h"

namespace tiermoe::py {

namespace {

MoeLayerConfig layer_config(const MoeOpConfig& cfg) {
  MoeLayerConfig l;
  l.absorb_scores = cfg.absorb;
  l.keep = cfg.keep;
  l.name = cfg.name;
  return l;
}

ExpertProj lora_proj(const std::string& name, const std::string& where) {
  if (name == "gate") return ExpertProj::gate;
  if (name == "up") return ExpertProj::up;
  TIERMOE_CHECK(name == "down", "unknown expert projection '" + name + "'", where,
                "gate, up or down");
  return ExpertProj::down;
}

}  // namespace

MoeOp::MoeOp(MoeOpConfig cfg)
    : cfg_(std::move(cfg)),
      // unbound: torch owns the weights; bind_experts points at them
      experts_(cfg_.experts, cfg_.dtype, cfg_.name + ".experts", /*unbound_weights=*/true),
      executor_(experts_),
      router_(cfg_.routes ? std::make_unique<Router>(cfg_.router, cfg_.dtype, cfg_.name + ".gate")
                          : nullptr),
      layer_(layer_config(cfg_), router_.get(), dispatcher_, executor_) {}

void MoeOp::bind_experts(Tensor w13_EFD, Tensor w2_EDF, Tensor b13_E2F, Tensor b2_ED) {
  experts_.bind_weights(std::move(w13_EFD), std::move(w2_EDF));
  if (cfg_.experts.bias) {
    TIERMOE_CHECK(b13_E2F.defined() && b2_ED.defined(), "the experts' biases are missing",
                  cfg_.name, "gpt-oss experts carry gate_up_proj_bias and down_proj_bias");
    check_shape(b13_E2F, experts_.param("b13").shape(), cfg_.name + ".experts.b13");
    check_shape(b2_ED, experts_.param("b2").shape(), cfg_.name + ".experts.b2");
    check_dtype(b13_E2F, cfg_.dtype, cfg_.name + ".experts.b13");
    check_dtype(b2_ED, cfg_.dtype, cfg_.name + ".experts.b2");
    experts_.param("b13") = std::move(b13_E2F);
    experts_.param("b2") = std::move(b2_ED);
  }
  experts_.weights_changed();
}

void MoeOp::bind_router(Tensor weight_ED, Tensor bias_E, Tensor selection_bias_E) {
  TIERMOE_CHECK(router_ != nullptr, "this op does not route", cfg_.name,
                "the experts backend takes its routing from transformers");
  const auto bind = [&](const char* name, Tensor t) {
    Tensor& p = router_->param(name);
    check_shape(t, p.shape(), cfg_.name + ".gate." + name);
    check_dtype(t, p.dtype(), cfg_.name + ".gate." + name);
    p = std::move(t);
  };
  bind("weight", std::move(weight_ED));
  if (cfg_.router.kind == RouterKind::gpt_oss) bind("bias", std::move(bias_E));
  if (cfg_.router.kind == RouterKind::deepseek_v3)
    bind("e_score_correction_bias", std::move(selection_bias_E));
}

void MoeOp::set_lora(int64_t rank, bool w13, bool w2) {
  // Called before every forward and backward: a LoRA of the same shape stays.
  const bool none = rank <= 0 || !(w13 || w2);
  if (none ? !lora_
           : lora_ && lora_->rank() == rank && lora_->has(ExpertProj::gate) == w13 &&
                 lora_->has(ExpertProj::down) == w2) {
    return;
  }
  experts_.set_adapter(nullptr);
  adapter_.reset();
  lora_.reset();
  if (none) return;
  LoraConfig c;
  c.rank = rank;
  c.alpha = double(rank);  // scaling 1
  c.targets.clear();
  if (w13) c.targets.insert({"gate_proj", "up_proj"});
  if (w2) c.targets.insert("down_proj");
  const ExpertsConfig& e = cfg_.experts;
  lora_ = std::make_unique<ExpertLora>(e.num_experts, e.hidden, e.ffn, c, cfg_.dtype,
                                       cfg_.name + ".experts");
  adapter_ = std::make_unique<ExpertLoraAdapter>(*lora_, e, cfg_.dtype);
  experts_.set_adapter(adapter_.get());
}

void MoeOp::bind_lora(const std::string& proj, Tensor A_ERI, Tensor B_EOR) {
  TIERMOE_CHECK(lora_ != nullptr, "expert LoRA weights for an op without LoRA", cfg_.name,
                "set_lora first");
  const ExpertProj p = lora_proj(proj, cfg_.name);
  const std::string what = cfg_.name + ".experts lora " + proj;
  Tensor& A = lora_->A(p);
  Tensor& B = lora_->B(p);
  check_shape(A_ERI, A.shape(), what + " A");
  check_shape(B_EOR, B.shape(), what + " B");
  check_dtype(A_ERI, A.dtype(), what + " A");
  check_dtype(B_EOR, B.dtype(), what + " B");
  A = std::move(A_ERI);
  B = std::move(B_EOR);
}

Tensor MoeOp::forward_routed(MoeSaved& saved, const Tensor& x_TD, std::vector<int32_t> ids_TK,
                             Tensor weights_TK, bool expert_grads, bool adapter_grads) {
  TIERMOE_CHECK(weights_TK.dim() == 2 && int64_t(ids_TK.size()) == weights_TK.numel(),
                "top_k_index and top_k_weights disagree: " + std::to_string(ids_TK.size()) +
                    " ids, weights " + weights_TK.str(),
                cfg_.name, "both are [tokens, top_k]");
  check_dtype(weights_TK, router_score_dtype(cfg_.dtype), cfg_.name + ": top_k_weights");
  Routing r;
  r.T = weights_TK.size(0);
  r.K = weights_TK.size(1);
  r.ids_TK = std::move(ids_TK);
  r.weights_TK = std::move(weights_TK);
  return layer_.forward(x_TD, std::move(r), saved, expert_grads, adapter_grads);
}

Tensor MoeOp::forward(MoeSaved& saved, Tensor& logits_TE, const Tensor& x_TD, bool expert_grads,
                      bool adapter_grads) {
  TIERMOE_CHECK(router_ != nullptr, "this op does not route", cfg_.name,
                "call forward_routed with transformers' routing");
  Tensor out = layer_.forward(x_TD, saved, expert_grads, adapter_grads);
  logits_TE = saved.routing.logits_TE;
  return out;
}

Tensor MoeOp::backward(Tensor& dx_TD, const Tensor& dout_TD, MoeSaved& saved,
                       const Tensor& dlogits_TE) {
  if (router_) router_->zero_grad();
  if (saved.weight_grads) {
    experts_.allocate_grads();
    experts_.zero_grad();
  }
  if (lora_) lora_->zero_grad();
  return layer_.backward(dx_TD, dout_TD, saved, dlogits_TE);
}

void MoeOp::attach_tier(DeviceTier& tier, int64_t layer) {
  layer_.set_experts(tier.attach(layer, experts_, executor_));
}

const Tensor& MoeOp::grad(const std::string& name) {
  if (name.starts_with("router.")) {
    TIERMOE_CHECK(router_ != nullptr, "this op has no router", cfg_.name,
                  "router gradients exist only under tiermoe.torch.patch");
    return router_->grad(name.substr(7));
  }
  if (name.starts_with("lora.")) {
    TIERMOE_CHECK(lora_ != nullptr, "this op has no expert LoRA", cfg_.name, "set_lora first");
    const size_t dot = name.rfind('.');
    const ExpertProj p = lora_proj(name.substr(5, dot - 5), cfg_.name);
    const std::string which = name.substr(dot + 1);
    TIERMOE_CHECK(which == "A" || which == "B", "unknown LoRA gradient '" + name + "'", cfg_.name,
                  "lora.<gate|up|down>.<A|B>");
    return which == "A" ? lora_->dA(p) : lora_->dB(p);
  }
  return experts_.grad(name);
}

}  // namespace tiermoe::py
