#pragma once
// PEFT LoRA adapters on disk (huggingface/peft): a directory
// holding `adapter_config.json` and `adapter_model.safetensors`, loadable by
// PEFT's PeftModel.from_pretrained and by vLLM.
//
// Tensors are keyed `base_model.model.<module path>.lora_A.weight` [r, in] and
// `.lora_B.weight` [out, r] (nn.Linear layout). MoE experts use the per-expert
// "2D" layout: `<layer>.mlp.experts.<e>.gate_proj` etc. are ordinary modules.
// That is what TierMoE writes; it also reads what PEFT 0.21 writes for
// transformers-5 models, whose experts are fused 3-D parameters adapted
// through target_parameters (src/io/peft_fused.h has the layout and the exact
// conditions), converting it into the per-expert modules.
//
// This header knows nothing of the model: a module path is a string and the
// weights are plain tensors. Only what TierMoE can train is representable:
// LoRA without DoRA, biases or modules_to_save, one rank and alpha for every
// module (rank_pattern / alpha_pattern only for the fused gate_up_proj).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

// The adapter_config.json fields TierMoE reads and writes. Every other field
// is written with PEFT's default (bias "none", use_dora false, ...).
struct PeftLoraConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  double lora_dropout = 0.0;
  bool use_rslora = false;
  std::vector<std::string> target_modules;  // module names, sorted on save
  // PEFT's layers_to_transform: the decoder layers adapted (sorted, no
  // repeats); empty: every layer. layers_pattern may only name "layers".
  std::vector<int64_t> layers_to_transform;
  std::string base_model_name_or_path;
  std::string task_type = "CAUSAL_LM";

  bool operator==(const PeftLoraConfig&) const = default;
};

// One adapted linear layer: A_RI [r, in], B_OR [out, r].
struct PeftLoraWeights {
  Tensor A_RI;
  Tensor B_OR;
};

// module path (no "base_model.model." prefix, e.g.
// "model.layers.3.self_attn.q_proj") -> its weights.
using PeftLoraModules = std::map<std::string, PeftLoraWeights>;

struct PeftAdapter {
  PeftLoraConfig config;
  PeftLoraModules modules;
};

inline constexpr const char* kPeftConfigFile = "adapter_config.json";
inline constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";
inline constexpr const char* kPeftKeyPrefix = "base_model.model.";

// Writes `dir` (created if needed): the weights first, then the config, each
// replaced atomically (so a reader never sees a half-written file; a crash
// between the two can leave new weights beside the old config). Tensors are
// stored as `storage` (f32, bf16 or f64; bf16 rounds to nearest even).
// Checks every module's shapes against config.r before writing anything.
void save_peft_adapter(const std::string& dir, const PeftLoraConfig& config,
                       const PeftLoraModules& modules, DType storage = DType::f32);

// Reads and validates an adapter directory. Tensors come back in their
// stored dtype (owning copies, tag weights); fused expert adapters come back
// as per-expert modules, their names added to target_modules. Rejected, each
// with an Error naming the file and key: a peft_type other than LORA,
// use_dora, a bias other than "none", lora_bias, fan_in_fan_out,
// modules_to_save, a rank_pattern or alpha_pattern giving a module another
// rank or alpha, target_parameters other than the experts' gate_up_proj and
// down_proj, a fused adapter TierMoE cannot represent exactly, a regex
// (string) target_modules, keys that are not
// `base_model.model.*.lora_{A,B}.weight`, a module with only one of A and B,
// shapes that are not [r, in] / [out, r], and a module whose name is not in
// target_modules.
PeftAdapter load_peft_adapter(const std::string& dir);

}  // namespace tiermoe
