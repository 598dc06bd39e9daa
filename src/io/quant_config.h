#pragma once
// config.json's quantization_config (the family's field table reads the rest).
#include <nlohmann/json.hpp>
#include <string>

#include "tiermoe/io/model_config.h"

namespace tiermoe {

// Sets c.quant_method, quant_bits and quant_group from `q`, refusing, with
// the field and a hint, what TierMoE does not read: anything but gpt-oss's
// MXFP4, block FP8 (e4m3, 128 x 128, dynamic activations) and
// compressed-tensors' symmetric int4/int8 weight-only schemes.
void parse_quantization_config(const nlohmann::json& q, const std::string& path, ModelConfig& c);

}  // namespace tiermoe
