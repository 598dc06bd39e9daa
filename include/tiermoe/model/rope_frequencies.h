#pragma once
// The RoPE frequencies a config implies, as transformers' rope init
// functions compute them (modeling_rope_utils): plain RoPE, inv_freq_i =
// theta^(-2i/Pr) (Pr = ModelConfig::rotary_dim()), or YaRN:
//
//   extra_i = theta^(-2i/Pr), inter_i = extra_i / factor
//   [low, high] = the correction range of beta_fast and beta_slow over
//                 original_max_position_embeddings (floored/ceiled with truncate)
//   ramp_i      = clamp((i - low) / (high - low), 0, 1)
//   inv_freq_i  = inter_i * ramp_i + extra_i * (1 - ramp_i)
//   cos/sin scaled by attention_factor (given, or 0.1 ln(factor) + 1, or the
//   mscale / mscale_all_dim ratio of those)
#include <cstdint>
#include <vector>

#include "tiermoe/io/model_config.h"

namespace tiermoe {

struct RopeFrequencies {
  int64_t rotary_dim = 0;  // Pr: the tables' width
  double theta = 10000.0;
  std::vector<double> inv_freq;  // [Pr / 2]; empty: plain RoPE from theta (kernels' rope_tables)
  double attention_factor = 1.0;
};

RopeFrequencies rope_frequencies(const ModelConfig& config);

// The attention's softmax scale: 1 / sqrt(qk_head_dim), and under MLA with
// YaRN's mscale_all_dim times mscale(factor, mscale_all_dim)^2 (transformers'
// yarn_apply_mscale: DeepSeek scales the non-rotary dims' logits too).
double attention_softmax_scale(const ModelConfig& config);

}  // namespace tiermoe
