#include "tiermoe/io/pack_quantized.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "tiermoe/core/error.h"

namespace tiermoe {

using detail::str_of;

std::vector<TensorBytes> PackedMatrix::tensors(const std::string& module) const {
  return {{module + ".weight_packed",
           "I32",
           {shape[0], packed_cols},
           packed.data(),
           uint64_t(packed.size())},
          {module + ".weight_scale",
           "BF16",
           {shape[0], scale_cols},
           scale.data(),
           uint64_t(scale.size()) * 2},
          {module + ".weight_shape", "I64", {2}, shape, 16}};
}

PackedMatrix pack_quantized(const QuantMatrix& q) {
  const bool int4 = q.format == QuantFormat::int4;
  TIERMOE_CHECK((int4 || q.format == QuantFormat::int8) && q.bf16_values && q.row_group == 1,
                str_of("pack_quantized writes int4/int8 with bf16 scales, not this ",
                       quant_format_name(q.format), " matrix"),
                "pack_quantized", "quantize the matrix with quantize_int");
  check_quant_matrix(q, "pack_quantized");
  PackedMatrix p;
  p.shape[0] = q.rows, p.shape[1] = q.cols;
  p.packed_cols = (q.cols * quant_code_bits(q.format) + 31) / 32;
  p.scale_cols = q.scale_cols();
  const int64_t row_bytes = p.packed_cols * 4;
  p.packed.assign(size_t(q.rows * row_bytes), 0);
  for (int64_t r = 0; r < q.rows; ++r) {
    uint8_t* dst = p.packed.data() + r * row_bytes;
    const uint8_t* src = q.codes + r * q.code_stride;
    if (int4) {
      std::memcpy(dst, src, size_t(row_bytes));  // the kernels' layout is the file's
    } else {
      for (int64_t c = 0; c < q.cols; ++c) dst[c] = uint8_t(src[c] ^ 0x80);  // q + 128
      // The padding of the last word holds q = 0, as compressed-tensors pads.
      for (int64_t c = q.cols; c < row_bytes; ++c) dst[c] = 0x80;
    }
  }
  if (int4) {
    // Padding nibbles past cols: q = 0 (the nibble 8), as compressed-tensors pads.
    for (int64_t r = 0; r < q.rows; ++r) {
      uint8_t* row = p.packed.data() + r * row_bytes;
      for (int64_t c = q.cols; c < p.packed_cols * 8; ++c) {
        row[c / 2] = uint8_t((row[c / 2] & (c & 1 ? 0x0f : 0xf0)) | (8 << ((c & 1) * 4)));
      }
    }
  }
  p.scale.resize(size_t(q.rows * p.scale_cols));
  const float* scales = static_cast<const float*>(q.scales);
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t g = 0; g < p.scale_cols; ++g) {
      p.scale[size_t(r * p.scale_cols + g)] = float_to_bf16(scales[r * q.scale_stride + g]).bits;
    }
  }
  return p;
}

uint64_t pack_quantized_bytes(QuantFormat format, int64_t rows, int64_t cols, int64_t group) {
  const int64_t packed_cols = (cols * quant_code_bits(format) + 31) / 32;
  return uint64_t(rows * packed_cols * 4 + rows * ((cols + group - 1) / group) * 2 + 16);
}

nlohmann::json pack_quantized_config(const ModelConfig& config, QuantFormat format, int64_t group) {
  const FamilySpec& spec = config.spec();
  const auto& [gate, up, down] = spec.expert_projections;
  const std::string experts = detail::str_of("re:.*", spec.moe_block, R"(\.experts\.\d+\.()", gate,
                                             "|", up, "|", down, ")$");
  const nlohmann::json weights = {{"num_bits", quant_code_bits(format)},
                                  {"type", "int"},
                                  {"symmetric", true},
                                  {"strategy", "group"},
                                  {"group_size", group},
                                  {"dynamic", false},
                                  {"actorder", nullptr},
                                  {"observer", "minmax"}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0",
             {{"targets", {experts}},
              {"weights", weights},
              {"input_activations", nullptr},
              {"output_activations", nullptr},
              {"format", "pack-quantized"}}}}},
          {"ignore", {"lm_head"}},
          {"kv_cache_scheme", nullptr}};
}

}  // namespace tiermoe
