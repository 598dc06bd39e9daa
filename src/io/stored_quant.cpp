#include "tiermoe/io/stored_quant.h"

#include <cstring>

#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/hf_names.h"

namespace tiermoe {

namespace {

using detail::str_of;

constexpr int64_t kFp8Block = 128;

// Element i of a BF16 or F32 tensor's bytes as f32.
float scale_at(const std::byte* p, const std::string& dtype, int64_t i) {
  if (dtype == "F32") {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return bf16_to_float(bf16{h});
}

class Checker {
 public:
  Checker(const CheckpointTensors& ck, std::string hint) : ck_(ck), hint_(std::move(hint)) {}

  const SafetensorsEntry& entry(const std::string& name, std::initializer_list<const char*> dtypes,
                                const Shape& shape) const {
    TIERMOE_CHECK(ck_.contains(name), str_of("checkpoint lacks '", name, "'"), ck_.dir(), hint_);
    const SafetensorsEntry& e = ck_.entry(name);
    bool dtype_ok = false;
    std::string want;
    for (const char* d : dtypes) {
      dtype_ok = dtype_ok || e.dtype == d;
      want += (want.empty() ? "" : " or ") + std::string(d);
    }
    TIERMOE_CHECK(dtype_ok, str_of("'", name, "' is ", e.dtype, ", not ", want), ck_.dir(), hint_);
    TIERMOE_CHECK(e.shape == shape,
                  str_of("'", name, "' has shape ", shape_str(e.shape), ", not ", shape_str(shape)),
                  ck_.dir(), hint_);
    return e;
  }

 private:
  const CheckpointTensors& ck_;
  std::string hint_;
};

std::optional<StoredQuant> find_compressed(const CheckpointTensors& ck, const ModelConfig& c,
                                           const std::string& weight) {
  const std::string m = hf_module_of(weight);
  const std::string packed = m + ".weight_packed", scale = m + ".weight_scale",
                    shape_name = m + ".weight_shape";
  const bool int_quantized = !ck.contains(packed) && ck.contains(weight) &&
                             ck.entry(weight).dtype == "I8" && ck.contains(scale);
  if (!ck.contains(packed) && !int_quantized) return std::nullopt;
  TIERMOE_CHECK(c.quant_method == "compressed-tensors",
                str_of("'", int_quantized ? weight : packed,
                       "' is compressed-tensors' but config.json's quantization_config ",
                       c.quant_method.empty() ? "is absent" : "says " + c.quant_method),
                ck.dir(), "use the config.json the checkpoint was written with");
  for (const char* extra : {".weight_zero_point", ".weight_g_idx"}) {
    TIERMOE_CHECK(!ck.contains(m + extra), str_of("checkpoint has '", m, extra, "'"), ck.dir(),
                  "TierMoE reads symmetric int4/int8 without activation order (g_idx); "
                  "requantize with symmetric: true and actorder null or \"static\"");
  }
  const std::string hint =
      str_of("compressed-tensors stores a ", c.quant_bits,
             "-bit matrix [out, in] as <module>.weight_packed "
             "I32 [out, ceil(in * bits / 32)], <module>.weight_scale [out, ceil(in / group)] and "
             "<module>.weight_shape I64 [2]");
  const Checker check(ck, hint);
  StoredQuant s;
  s.weight = weight;
  s.format = c.quant_bits == 4 ? QuantFormat::int4 : QuantFormat::int8;
  if (int_quantized) {
    s.shape = ck.entry(weight).shape;
    TIERMOE_CHECK(s.shape.size() == 2 && c.quant_bits == 8,
                  str_of("'", weight, "' is I8 ", shape_str(s.shape), " in a ", c.quant_bits,
                         "-bit checkpoint"),
                  ck.dir(), "int-quantized stores int8 matrices [out, in] as I8");
    s.tensors = {weight, scale};
  } else {
    check.entry(shape_name, {"I64", "I32"}, {2});
    const auto bytes = ck.file_of(shape_name).bytes(shape_name);
    const bool i64 = ck.entry(shape_name).dtype == "I64";
    for (int i = 0; i < 2; ++i) {
      int64_t v = 0;
      std::memcpy(&v, bytes.data() + (i64 ? 8 : 4) * i, i64 ? 8 : 4);
      if (!i64) v = int32_t(v);
      s.shape.push_back(v);
    }
    TIERMOE_CHECK(s.shape[0] > 0 && s.shape[1] > 0,
                  str_of("'", shape_name, "' holds ", shape_str(s.shape)), ck.dir(), hint);
    const int64_t per_word = 32 / c.quant_bits;
    check.entry(packed, {"I32"}, {s.shape[0], (s.shape[1] + per_word - 1) / per_word});
    s.tensors = {packed, scale, shape_name};
  }
  s.group = c.quant_group > 0 ? c.quant_group : s.shape[1];
  // F16 scales (an f16 model's) would make each value f16(q * scale): not read.
  check.entry(scale, {"BF16", "F32"}, {s.shape[0], (s.shape[1] + s.group - 1) / s.group});
  return s;
}

}  // namespace

std::optional<StoredQuant> find_stored_quant(const CheckpointTensors& ck, const ModelConfig& c,
                                             const std::string& weight) {
  if (auto s = find_compressed(ck, c, weight)) return s;
  if (!ck.contains(weight) || ck.entry(weight).dtype != "F8_E4M3") return std::nullopt;
  const std::string scale = hf_module_of(weight) + ".weight_scale_inv";
  const Shape shape = ck.entry(weight).shape;
  const Checker check(ck,
                      "block FP8 stores a matrix [out, in] as <module>.weight F8_E4M3 and "
                      "<module>.weight_scale_inv F32 [ceil(out / 128), ceil(in / 128)]");
  TIERMOE_CHECK(shape.size() == 2, str_of("'", weight, "' is F8_E4M3 ", shape_str(shape)), ck.dir(),
                "an FP8 matrix is 2-D, [out, in]");
  check.entry(scale, {"F32"},
              {(shape[0] + kFp8Block - 1) / kFp8Block, (shape[1] + kFp8Block - 1) / kFp8Block});
  return StoredQuant{weight, QuantFormat::fp8, shape, kFp8Block, {weight, scale}};
}

QuantMatrix read_stored_quant(const CheckpointTensors& ck, const StoredQuant& s, MemTag tag) {
  const int64_t rows = s.shape[0], cols = s.shape[1];
  const bool fp8 = s.format == QuantFormat::fp8;
  QuantBuffer buf = alloc_quant_matrix(s.format, rows, cols, s.group, fp8 ? kFp8Block : 1, tag);
  const QuantMatrix& q = buf.matrix;
  // Codes: the first tensor; int8 packed four to a word (stride a whole
  // number of words) is re-biased from q + 128.
  const std::string& codes_name = s.tensors[0];
  const auto codes = ck.file_of(codes_name).bytes(codes_name);
  const int64_t src_stride = int64_t(codes.size()) / rows;
  const bool rebias = s.format == QuantFormat::int8 && ck.entry(codes_name).dtype == "I32";
  parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const std::byte* src = codes.data() + r * src_stride;
      uint8_t* dst = buf.codes + r * q.code_stride;
      std::memcpy(dst, src, size_t(q.code_stride));
      if (rebias) {
        for (int64_t i = 0; i < cols; ++i) dst[i] ^= 0x80;
      }
    }
  });
  const std::string& scale_name = s.tensors[1];
  const auto scales = ck.file_of(scale_name).bytes(scale_name);
  const std::string& dtype = ck.entry(scale_name).dtype;
  float* out = static_cast<float*>(buf.scales);
  buf.matrix.bf16_values = dtype == "BF16";  // compressed-tensors multiplies in the scales' dtype
  for (int64_t i = 0; i < q.scale_rows() * q.scale_stride; ++i) {
    out[i] = scale_at(scales.data(), dtype, i);
  }
  // Frozen low-width tensors are only ever read: their pages can go.
  for (const std::string& t : s.tensors) ck.file_of(t).release(t);
  return q;
}

Tensor load_stored_quant(const CheckpointTensors& ck, const StoredQuant& s, DType dtype,
                         MemTag tag) {
  return dequantize(read_stored_quant(ck, s, MemTag::activations), dtype, tag);
}

std::vector<StoredQuant> find_stored_parts(const CheckpointTensors& ck, const ModelConfig& config,
                                           const std::vector<std::string>& weights) {
  std::vector<StoredQuant> parts;
  for (const std::string& w : weights) {
    if (auto q = find_stored_quant(ck, config, w)) parts.push_back(std::move(*q));
  }
  TIERMOE_CHECK(
      parts.empty() || parts.size() == weights.size(),
      str_of("'", weights.front(), "' and '", weights.back(), "' are stored at different widths"),
      ck.dir(), "a checkpoint quantizes an MLP's gate and up projections alike");
  return parts;
}

QuantMatrix read_stored_parts(const CheckpointTensors& ck, const std::vector<StoredQuant>& parts,
                              MemTag tag) {
  if (parts.size() == 1) return read_stored_quant(ck, parts[0], tag);
  std::vector<QuantMatrix> read;
  for (const StoredQuant& q : parts) read.push_back(read_stored_quant(ck, q, MemTag::activations));
  return stack_quant_rows(read, tag);
}

Tensor load_stored_parts(const CheckpointTensors& ck, const std::vector<StoredQuant>& parts,
                         DType dtype, MemTag tag) {
  int64_t rows = 0;
  for (const StoredQuant& q : parts) rows += q.shape[0];
  Tensor out = Tensor::empty({rows, parts.front().shape[1]}, dtype, tag);
  int64_t r = 0;
  for (const StoredQuant& q : parts) {
    out.rows(r, r + q.shape[0]).copy_from(load_stored_quant(ck, q, dtype));
    r += q.shape[0];
  }
  return out;
}

}  // namespace tiermoe
