#include "tiermoe/model/moe_block.h"

#include "tiermoe/moe/expert_kernels.h"

namespace tiermoe {

namespace {

RouterConfig router_config(const ModelConfig& c) {
  RouterConfig r;
  switch (c.spec().router) {
    case RouterRule::softmax_topk:
      r.kind = RouterKind::softmax_topk;
      break;
    case RouterRule::sigmoid_grouped:
      r.kind = RouterKind::deepseek_v3;
      break;
    case RouterRule::softmax_grouped:
      r.kind = RouterKind::deepseek_v2;
      r.routed_scaling_factor = c.routed_scaling_factor;
      if (c.topk_method == "group_limited_greedy") {  // greedy: all experts, one group
        r.n_group = c.n_group;
        r.topk_group = c.topk_group;
      }
      break;
    case RouterRule::topk_softmax:
      r.kind = RouterKind::gpt_oss;
      break;
  }
  r.hidden = c.hidden_size;
  r.num_experts = c.num_experts;
  r.top_k = c.num_experts_per_tok;
  r.norm_topk_prob = c.renormalize_topk();
  if (c.sigmoid_router()) {
    r.n_group = c.n_group;
    r.topk_group = c.topk_group;
    r.routed_scaling_factor = c.routed_scaling_factor;
  }
  return r;
}

// With expert parallelism this rank holds E / ranks of the experts.
ExpertsConfig experts_config(const ModelConfig& c, const Dispatcher& d) {
  ExpertsConfig e;
  e.num_experts = c.num_experts / d.ranks();
  e.hidden = c.hidden_size;
  e.ffn = c.moe_intermediate_size;
  e.activation = ExpertActivation::swiglu;
  if (c.spec().clamped_experts) {  // the clamped GLU on interleaved gate/up, biases on both
    e.activation = ExpertActivation::gpt_oss;
    e.gpt_oss = {c.swiglu_alpha, c.swiglu_limit};
    e.bias = true;
  }
  return e;
}

MoeLayerConfig layer_config(const std::string& name) {
  MoeLayerConfig l;
  l.name = name;
  return l;
}

}  // namespace

MoeBlock::MoeBlock(const ModelConfig& config, DType compute, const Dispatcher& dispatcher,
                   std::string name, MatrixAlloc alloc)
    : router_(router_config(config), compute, name + "." + std::string(config.spec().router_name)),
      experts_(experts_config(config, dispatcher), compute, name + ".experts",
               alloc == MatrixAlloc::unbound),
      first_expert_(experts_.config().num_experts * dispatcher.rank()),
      total_experts_(config.num_experts),
      executor_(experts_),
      layer_(layer_config(name), &router_, dispatcher, executor_) {
  experts_.packs().set_enabled(!experts_grad_);  // as set_experts_requires_grad says
}

MoeBlock::~MoeBlock() = default;

void MoeBlock::set_experts_requires_grad(bool on) {
  TIERMOE_CHECK(!(on && experts_.quantized()), "quantized experts are frozen",
                experts_.name(),
                "train LoRA adapters on them; full fine-tuning needs them in the compute dtype");
  // Expert grads are allocated on first use (backward, params()).
  experts_grad_ = on;
  if (!on) experts_.free_grads();
  // Only frozen experts run on the grouped kernels (moe/expert_kernels.h):
  // trainable ones change at every optimizer step, and re-packing all of a
  // layer's weights each step cost more than the kernels saved (full
  // fine-tuning at Qwen3-30B-A3B shapes ran at 0.57-0.95x of one GEMM per
  // expert, docs/benchmarks.md). Both give the same bits.
  experts_.packs().set_enabled(!on);
}

void MoeBlock::set_moe_options(AbsorbScores absorb, const MoeRegionKeep& keep) {
  layer_.set_options(absorb, keep);
}

void MoeBlock::enable_lora(const LoraConfig& config, Rng& rng) {
  const ExpertsConfig& c = experts_.config();
  if (c.activation == ExpertActivation::gpt_oss) {
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      TIERMOE_CHECK(!lora_targets_module(config, experts_.name() + ".0." + proj),
                    detail::str_of("LoRA target '", proj, "' names gpt-oss's experts"),
                    experts_.name(),
                    "LoRA on gpt-oss's fused experts is not implemented yet; target the "
                    "attention projections (q_proj,k_proj,v_proj,o_proj)");
    }
    return;
  }
  auto lora = std::make_unique<ExpertLora>(c.num_experts, c.hidden, c.ffn, config, experts_.dtype(),
                                           experts_.name(), first_expert_, total_experts_);
  if (lora->empty()) return;
  lora->init(rng);
  lora_ = std::move(lora);
  hook_ = std::make_unique<ExpertLoraAdapter>(*lora_, c, experts_.dtype());
  experts_.set_adapter(hook_.get());
}

void MoeBlock::set_router_requires_grad(bool on) {
  router_grad_ = on;
  if (!on) router_.zero_grad();  // nothing stale if it trains again
}

Tensor MoeBlock::forward(const Tensor& x_TD, MoeSaved& saved, bool weight_grads) {
  return layer_.forward(x_TD, saved, weight_grads && experts_grad_,
                        /*adapter_grads=*/weight_grads);
}

void MoeBlock::backward(Tensor& dx_TD, const Tensor& dy_TD, MoeSaved& saved,
                        const Tensor& dlogits_extra_TE, bool accumulate) {
  layer_.backward(dx_TD, dy_TD, saved, dlogits_extra_TE, accumulate);
}

}  // namespace tiermoe
