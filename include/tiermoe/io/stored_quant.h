#pragma once
// Linear weights a checkpoint ships at low width, each beside the name its
// float form would have (`<module>.weight`, nn.Linear's [out, in]):
//
//   block FP8 (quant_method "fp8": DeepSeek-V3/R1, Kimi-K2, the -FP8
//   releases): <module>.weight F8_E4M3 [out, in] and
//   <module>.weight_scale_inv F32 [ceil(out/128), ceil(in/128)], a
//   multiplier per 128 x 128 block, edge blocks included;
//
//   compressed-tensors (llm-compressor), symmetric, per group along `in` or
//   per channel: "pack-quantized" <module>.weight_packed I32 [out,
//   ceil(in * bits / 32)] (int4 as q + 8, int8 as q + 128, the first
//   element in the lowest bits), <module>.weight_scale [out, groups] (BF16
//   or F32: each value is q * scale rounded to the scales' dtype, as
//   compressed-tensors computes it) and <module>.weight_shape I64 [2] = [out, in]; or
//   "int-quantized" int8, <module>.weight I8 [out, in] and its weight_scale.
//
// gpt-oss's MXFP4 experts are fused stacks named otherwise (io/mxfp4.h).
// Each reader names the tensor and what it expected when a part is missing
// or of the wrong dtype or shape.
#include <optional>
#include <string>
#include <vector>

#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {

struct StoredQuant {
  std::string weight;  // "<module>.weight"
  QuantFormat format = QuantFormat::int4;
  Shape shape;                       // [out, in]
  int64_t group = 0;                 // columns per scale
  std::vector<std::string> tensors;  // the on-disk tensors it is read from
};

// How the checkpoint stores matrix `weight` at low width, or nullopt when
// it holds it as a float tensor (or not at all). `config` gives
// compressed-tensors' bits and group (quant_bits, quant_group).
std::optional<StoredQuant> find_stored_quant(const CheckpointTensors& ck, const ModelConfig& config,
                                             const std::string& weight);

// Its codes and f32 scales, copied into memory of their own (`tag`): the
// kernels' layout (kernels/quant.h) takes int4's words as they are, int8's
// packed bytes re-biased to signed ones. The source pages are released
// (SafetensorsFile::release).
QuantMatrix read_stored_quant(const CheckpointTensors& ck, const StoredQuant& s,
                              MemTag tag = MemTag::weights);

// The matrix decoded to `dtype` (exact in f32 and f64; bf16 rounds each
// value once), for runs that compute with it or train it.
Tensor load_stored_quant(const CheckpointTensors& ck, const StoredQuant& s, DType dtype,
                         MemTag tag = MemTag::activations);

// The low-width storage of matrices `weights` stacked along rows (an MLP's
// gate over its up), or none when the checkpoint holds them as floats;
// throws naming them when only some are at low width.
std::vector<StoredQuant> find_stored_parts(const CheckpointTensors& ck, const ModelConfig& config,
                                           const std::vector<std::string>& weights);
// Those parts at their width, stacked (kernels/quant.h: stack_quant_rows).
QuantMatrix read_stored_parts(const CheckpointTensors& ck, const std::vector<StoredQuant>& parts,
                              MemTag tag = MemTag::weights);
// Those parts decoded to `dtype`, stacked.
Tensor load_stored_parts(const CheckpointTensors& ck, const std::vector<StoredQuant>& parts,
                         DType dtype, MemTag tag = MemTag::weights);

}  // namespace tiermoe
