#include "tiermoe/io/mxfp4.h"

#include <cmath>

#include "tiermoe/core/error.h"
#include "tiermoe/core/memory.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe {

namespace {

using detail::str_of;

constexpr int64_t kBlock = 32;  // values per scale
// Keeps the blocks' and scales' mappings alive for the matrices viewing
// them, and counts their bytes under MemTag::mapped while any of them lives.
struct MappedCodes {
  MappedCodes(std::shared_ptr<const void> blocks, std::shared_ptr<const void> scales, size_t bytes)
      : blocks_(std::move(blocks)), scales_(std::move(scales)), bytes_(bytes) {
    MemoryTracker::process().on_alloc(MemTag::mapped, bytes_);
  }
  ~MappedCodes() { MemoryTracker::process().on_free(MemTag::mapped, bytes_); }
  MappedCodes(const MappedCodes&) = delete;
  MappedCodes& operator=(const MappedCodes&) = delete;

 private:
  std::shared_ptr<const void> blocks_, scales_;
  size_t bytes_;
};

std::string blocks_of(const std::string& name) { return name + "_blocks"; }
std::string scales_of(const std::string& name) { return name + "_scales"; }

}  // namespace

bool stores_mxfp4(const CheckpointTensors& ck, const std::string& name) {
  return ck.contains(blocks_of(name));
}

Shape mxfp4_shape(const CheckpointTensors& ck, const std::string& name) {
  const std::string b = blocks_of(name), s = scales_of(name);
  const std::string hint =
      "an MXFP4 matrix [E, out, in] is stored as <name>_blocks U8 [E, out, in/32, 16] and "
      "<name>_scales U8 [E, out, in/32]";
  TIERMOE_CHECK(ck.contains(s), str_of("checkpoint has '", b, "' but not '", s, "'"), ck.dir(),
                hint);
  const SafetensorsEntry& be = ck.entry(b);
  const SafetensorsEntry& se = ck.entry(s);
  TIERMOE_CHECK(be.dtype == "U8" && se.dtype == "U8",
                str_of("'", b, "' is ", be.dtype, " and '", s, "' is ", se.dtype), ck.dir(), hint);
  const bool shapes_ok = be.shape.size() == 4 && be.shape[3] == kBlock / 2 &&
                         se.shape == Shape{be.shape[0], be.shape[1], be.shape[2]};
  TIERMOE_CHECK(
      shapes_ok,
      str_of("'", b, "' has shape ", shape_str(be.shape), " and '", s, "' ", shape_str(se.shape)),
      ck.dir(), hint);
  return {be.shape[0], be.shape[1], be.shape[2] * kBlock};
}

Tensor load_mxfp4(const CheckpointTensors& ck, const std::string& name, DType dtype, MemTag tag) {
  const Shape shape = mxfp4_shape(ck, name);
  const auto blocks = ck.file_of(blocks_of(name)).bytes(blocks_of(name));
  const auto scales = ck.file_of(scales_of(name)).bytes(scales_of(name));
  const int64_t groups = int64_t(scales.size());  // E * out * in/32 blocks
  Tensor out = Tensor::empty(shape, dtype, tag);
  visit_dtype(dtype, [&]<class T>() {
    using A = acc_t<T>;
    T* dst = out.data<T>();
    parallel_for(groups, 1024, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        const int exp = int(std::to_integer<uint8_t>(scales[size_t(g)])) - 127;
        for (int64_t j = 0; j < kBlock / 2; ++j) {
          const uint8_t byte = std::to_integer<uint8_t>(blocks[size_t(g * kBlock / 2 + j)]);
          dst[g * kBlock + 2 * j] = store<T>(A(std::ldexp(A(kE2m1Values[byte & 15]), exp)));
          dst[g * kBlock + 2 * j + 1] = store<T>(A(std::ldexp(A(kE2m1Values[byte >> 4]), exp)));
        }
      }
    });
  });
  return out;
}

std::vector<QuantMatrix> mxfp4_matrices(const CheckpointTensors& ck, const std::string& name,
                                        int64_t first, int64_t count) {
  const Shape shape = mxfp4_shape(ck, name);  // [E, out, in]
  TIERMOE_CHECK(first >= 0 && count >= 0 && first + count <= shape[0],
                str_of("experts [", first, ", ", first + count, ") of '", name, "', which holds ",
                       shape[0]),
                ck.dir(), "the checkpoint holds fewer experts than the config says");
  const SafetensorsFile& bf = ck.file_of(blocks_of(name));
  const SafetensorsFile& sf = ck.file_of(scales_of(name));
  const auto blocks = bf.bytes(blocks_of(name));
  const auto scales = sf.bytes(scales_of(name));
  const int64_t out = shape[1], in = shape[2], row_blocks = in / kBlock;
  auto owner = std::make_shared<MappedCodes>(
      bf.mapping(), sf.mapping(), size_t(count * out * (in / 2 + row_blocks)));
  std::vector<QuantMatrix> m(static_cast<size_t>(count));
  for (int64_t e = 0; e < count; ++e) {
    QuantMatrix& q = m[size_t(e)];
    q.format = QuantFormat::mxfp4;
    q.rows = out, q.cols = in, q.group = kBlock;
    q.code_stride = row_blocks * kBlock / 2;
    q.scale_stride = row_blocks;
    q.codes = reinterpret_cast<const uint8_t*>(blocks.data()) + (first + e) * out * q.code_stride;
    q.scales = reinterpret_cast<const uint8_t*>(scales.data()) + (first + e) * out * row_blocks;
    q.owner = owner;
  }
  return m;
}

}  // namespace tiermoe
