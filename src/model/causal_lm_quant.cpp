// The routed experts at a low-bit width (CausalLM::quantize_experts): each
// MoE layer's experts quantized from their present weights and bound as
// stored codes (moe/experts.h), the widened weights released layer by layer.
#include <vector>

#include "tiermoe/model/causal_lm.h"

namespace tiermoe {

std::pair<int64_t, int64_t> CausalLM::quantize_experts(QuantFormat format, int64_t group) {
  int64_t before = 0, after = 0;
  for (auto& l : layers_) {
    if (!l->is_moe()) continue;
    TIERMOE_CHECK(!l->moe()->experts_requires_grad(),
                  "quantized experts are frozen, and these train", l->prefix() + "mlp.experts",
                  "train LoRA adapters: full fine-tuning trains the experts in the compute dtype");
    GroupedExperts& ex = l->moe()->experts();
    before += ex.weight_bytes();
    const int64_t E = ex.config().num_experts;
    std::vector<QuantMatrix> w13(static_cast<size_t>(E)), w2(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const ExpertWeights w = ex.weights(e);
      w13[size_t(e)] = quantize_int(w.w13_FD, format, group);
      w2[size_t(e)] = quantize_int(w.w2_DF, format, group);
    }
    ex.bind_quantized_weights(std::move(w13), std::move(w2));
    after += ex.weight_bytes();
  }
  return {before, after};
}

}  // namespace tiermoe
