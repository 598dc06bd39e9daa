#pragma once
// Writing compressed-tensors' "pack-quantized" checkpoints, as llm-compressor
// writes them and transformers 5, vLLM and the compressed-tensors package
// read them (the layout io/stored_quant.h reads): a matrix quantized by
// quantize_int (kernels/quant.h) as its three tensors, and the
// quantization_config that names which modules they are.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {

// One matrix's tensors, owning their bytes: <module>.weight_packed I32 [out,
// ceil(in * bits / 32)] (int4 as q + 8, int8 as q + 128, the first element
// in the lowest bits), <module>.weight_scale BF16 [out, groups],
// <module>.weight_shape I64 [2].
struct PackedMatrix {
  std::vector<uint8_t> packed;
  std::vector<uint16_t> scale;
  int64_t shape[2] = {0, 0};
  int64_t packed_cols = 0, scale_cols = 0;
  // The tensors to write, viewing this matrix's bytes.
  std::vector<TensorBytes> tensors(const std::string& module) const;
};

// q's tensors: int4 or int8 with bf16 scales (bf16_values), as quantize_int
// makes them.
PackedMatrix pack_quantized(const QuantMatrix& q);

// The bytes pack_quantized writes for a [rows, cols] matrix (shard plans).
uint64_t pack_quantized_bytes(QuantFormat format, int64_t rows, int64_t cols, int64_t group);

// quantization_config for a checkpoint of `config` whose routed experts (and
// nothing else) are `format` with `group` columns per scale: one config
// group targeting the experts' projections by regex, lm_head ignored.
nlohmann::json pack_quantized_config(const ModelConfig& config, QuantFormat format, int64_t group);

}  // namespace tiermoe
