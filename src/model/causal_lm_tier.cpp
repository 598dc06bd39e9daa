#include "tiermoe/model/causal_lm.h"

namespace tiermoe {

int64_t CausalLM::num_moe_layers() const {
  int64_t n = 0;
  for (const auto& l : layers_) n += l->is_moe();
  return n;
}

std::optional<ExpertQuant> CausalLM::expert_quant() const {
  std::optional<ExpertQuant> first;
  bool seen = false;
  for (const auto& l : layers_) {
    if (!l->is_moe()) continue;
    const std::optional<ExpertQuant> q = l->moe()->experts().quant();
    TIERMOE_CHECK(!seen || q == first,
                  "the MoE layers hold their experts in different formats (" +
                      (first ? first->str() : std::string("unquantized")) + " and " +
                      (q ? q->str() : std::string("unquantized")) + ")",
                  "CausalLM", "quantize every layer's routed experts the same way");
    first = q;
    seen = true;
  }
  return first;
}

LayerTimes CausalLM::layer_times() const {
  LayerTimes sum;
  for (const auto& l : layers_) {
    sum.attention_s += l->times().attention_s;
    sum.mlp_s += l->times().mlp_s;
  }
  return sum;
}

void CausalLM::expert_weights_changed() {
  // Frozen experts (LoRA) did not change: their packs stay.
  for (auto& l : layers_) {
    if (l->is_moe() && l->moe()->experts_requires_grad()) l->moe()->experts().weights_changed();
  }
}

void CausalLM::attach_device_tier(DeviceTier& tier) {
  TIERMOE_CHECK(!tier_, "a device tier is attached already", "CausalLM",
                "attach one tier per model");
  TIERMOE_CHECK(tier.profile().layers() == num_moe_layers(),
                detail::str_of("the device tier has ", tier.profile().layers(),
                               " layers, the model ", num_moe_layers(), " MoE layers"),
                "CausalLM", "build the tier from this model's config");
  int64_t i = 0;
  for (auto& l : layers_) {
    MoeBlock* moe = l->moe();
    if (!moe) continue;
    moe->set_executor(tier.attach(i++, moe->experts(), moe->host_executor()));
  }
  tier_ = &tier;
}

}  // namespace tiermoe
