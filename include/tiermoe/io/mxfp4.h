#pragma once
// MXFP4, the microscaling 4-bit format gpt-oss ships its experts in
// (quantization_config.quant_method "mxfp4"). A matrix W [E, out, in] is two
// U8 tensors beside its name: W_blocks [E, out, in/32, 16] (a block of 32
// values along `in`, two per byte: element 2j in the low nibble of byte j,
// 2j+1 in the high one) and W_scales [E, out, in/32] (an E8M0 exponent per
// block). A nibble is an E2M1 code, bit 3 the sign:
//   value = [0, .5, 1, 1.5, 2, 3, 4, 6][code & 7] * (code & 8 ? -1 : 1) * 2^(scale - 127)
// with no special case for scale 255 (inf where the code is not zero), as
// transformers' convert_moe_packed_tensors and openai/gpt-oss decode it.
// Decoded rows are [E, out, in]: gpt-oss's gate_up_proj comes out [E, 2F, D]
// (gate and up interleaved along 2F), TierMoE's w13 layout, with no transpose.
#include <string>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {

// Whether the checkpoint stores matrix `name` as MXFP4 (name_blocks).
bool stores_mxfp4(const CheckpointTensors& ck, const std::string& name);
// The shape [E, out, in] the stored blocks and scales of `name` decode to;
// throws naming the tensor unless they are U8 of matching shapes.
Shape mxfp4_shape(const CheckpointTensors& ck, const std::string& name);
// Decodes matrix `name` into a new tensor of `dtype` (every MXFP4 value is
// exact in bf16, f32 and f64). The reference decode.
Tensor load_mxfp4(const CheckpointTensors& ck, const std::string& name, DType dtype,
                  MemTag tag = MemTag::weights);
// Experts [first, first + count) of matrix `name` kept as stored
// (kernels/quant.h): views of the mapped blocks and scales, no copy.
std::vector<QuantMatrix> mxfp4_matrices(const CheckpointTensors& ck, const std::string& name,
                                        int64_t first, int64_t count);

}  // namespace tiermoe
