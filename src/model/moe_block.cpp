#include "tiermoe/model/moe_block.h"

namespace tiermoe {

namespace {

RouterConfig router_config(const ModelConfig& c) {
  RouterConfig r;
  r.kind = RouterKind::softmax_topk;
  r.hidden = c.hidden_size;
  r.num_experts = c.num_experts;
  r.top_k = c.num_experts_per_tok;
  r.norm_topk_prob = c.renormalize_topk();
  return r;
}

ExpertsConfig experts_config(const ModelConfig& c) {
  ExpertsConfig e;
  e.num_experts = c.num_experts;
  e.hidden = c.hidden_size;
  e.ffn = c.moe_intermediate_size;
  e.activation = ExpertActivation::swiglu;
  return e;
}

MoeLayerConfig layer_config(const std::string& name) {
  MoeLayerConfig l;
  l.name = name;
  return l;
}

}  // namespace

MoeBlock::MoeBlock(const ModelConfig& config, DType compute, const Dispatcher& dispatcher,
                   std::string name)
    : router_(router_config(config), compute, name + ".gate"),
      experts_(experts_config(config), compute, name + ".experts"),
      executor_(experts_),
      layer_(layer_config(name), &router_, dispatcher, executor_) {}

void MoeBlock::set_experts_requires_grad(bool on) {
  // Expert grads are allocated on first use; experts frozen before that
  // never hold them (GroupedExperts cannot drop them once allocated: frozen
  // experts then just stop accumulating, weight_grads = false).
  experts_grad_ = on;
}

void MoeBlock::zero_grad() {
  router_.zero_grad();
  if (experts_.has_grads()) experts_.zero_grad();
}

Tensor MoeBlock::forward(const Tensor& x_TD, MoeSaved& saved, bool weight_grads) {
  return layer_.forward(x_TD, saved, weight_grads && experts_grad_);
}

void MoeBlock::backward(Tensor& dx_TD, const Tensor& dy_TD, MoeSaved& saved,
                        const Tensor& dlogits_extra_TE, bool accumulate) {
  layer_.backward(dx_TD, dy_TD, saved, dlogits_extra_TE, accumulate);
}

}  // namespace tiermoe
