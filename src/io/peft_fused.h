#pragma once
// What PEFT 0.21 writes for a transformers-5 MoE model, read into TierMoE's
// per-expert LoRA modules. Private to src/io (load_peft_adapter calls it).
//
// transformers 5 stores a layer's experts as two 3-D parameters,
// mlp.experts.gate_up_proj [E, 2F, D] (gate rows, then up rows) and
// mlp.experts.down_proj [E, D, F]. PEFT adapts them through
// `target_parameters` (lora.ParamWrapper): one LoRA of rank R per parameter
// whose factors hold every expert,
//   lora_A [R*E, in]:  expert e's A_e [R, in] is rows [e*R, (e+1)*R)
//   lora_B [out, R*E]: expert e's B_e [out, R] is columns e, E + e, 2E + e, ...
//   delta W_e = scaling * B_e A_e   (ParamWrapper.get_delta_weight)
// with R and lora_alpha from rank_pattern / alpha_pattern when one of their
// patterns matches the parameter's key (peft.utils.other.get_pattern_key:
// re.match(rf"(.*\.)?({pattern})$", key)). Targeting both parameters nests
// the wrappers, gate_up_proj innermost, so its keys are
// `<layer>.mlp.experts.base_layer.lora_{A,B}.weight` and down_proj's
// `<layer>.mlp.experts.lora_{A,B}.weight`; a lone target is `experts.lora_*`.
//
// When a transformers-5 model is given target_modules gate_proj / up_proj /
// down_proj (or loads a per-expert adapter), PEFT converts them
// (peft.utils.transformers_weight_conversion): gate and up become one
// gate_up_proj LoRA of rank 2r and alpha 2*alpha (the same scaling), A the two
// A's stacked, B block-diagonal [[B_gate, 0], [0, B_up]].
//
// TierMoE's expert LoRA is per-expert gate_proj, up_proj and down_proj of
// rank r, one scaling. So the fused forms map onto it exactly when:
//   down_proj:    R == r and the scaling is TierMoE's: A_e, B_e as they are.
//   gate_up_proj: the scaling is TierMoE's and either R == 2r with B_e
//                 block-diagonal (gate: A_e rows [0, r), B_e rows [0, F) cols
//                 [0, r); up: rows [r, 2r), rows [F, 2F), cols [r, 2r)), or
//                 R == r (gate and up both read A_e; B_e's row halves).
// Anything else (a gate_up B that couples gate and up, as PEFT training
// leaves it; another rank; another scaling) is refused, naming the key and
// saying which condition fails.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tiermoe/io/peft.h"

namespace tiermoe::detail {

// adapter_config.json's fields for per-module ranks and alphas and for
// parameter targets, as PEFT writes them.
struct PeftPatterns {
  std::vector<std::pair<std::string, int64_t>> rank;  // rank_pattern
  std::vector<std::pair<std::string, double>> alpha;  // alpha_pattern
  std::vector<std::string> target_parameters;
};

// Reads rank_pattern, alpha_pattern and target_parameters (absent or null:
// empty) from the adapter config `j`, checking their types and that each
// pattern is a regular expression TierMoE can evaluate; errors name `path`.
PeftPatterns parse_peft_patterns(const nlohmann::json& j, const std::string& path);

// The rank and alpha PEFT gives the module or parameter `key`: the value of
// the first pattern that matches it, else r and lora_alpha. Two matching
// patterns with different values are an Error (JSON objects keep no order
// here, so PEFT's "first" is not known).
int64_t pattern_rank(const PeftPatterns& p, const PeftLoraConfig& c, const std::string& key,
                     const std::string& where);
double pattern_alpha(const PeftPatterns& p, const PeftLoraConfig& c, const std::string& key,
                     const std::string& where);

// Whether a weights key's module path is a fused experts wrapper
// ("...experts" or "...experts.base_layer", any number of base_layer).
bool is_fused_experts_path(const std::string& module_path);

// One fused wrapper's tensors as stored, by module path.
struct FusedLora {
  Tensor A, B;
};

// Converts every fused wrapper into per-expert modules
// (`<experts>.<e>.gate_proj`, `.up_proj`, `.down_proj`, rank config.r) added
// to `adapter.modules`, and adds the matching names to
// adapter.config.target_modules. `where` names the weights file.
void convert_fused_experts(PeftAdapter& adapter, const std::map<std::string, FusedLora>& fused,
                           const PeftPatterns& patterns, const std::string& where);

}  // namespace tiermoe::detail
