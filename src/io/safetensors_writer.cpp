#include <algorithm>
#include <bit>
#include <numeric>
#include <set>

#include "safetensors_common.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; TierMoE writes host memory as is");

namespace {

using detail::str_of;

void check_utf8(const std::string& s, const std::string& what, const std::string& path) {
  TIERMOE_CHECK(detail::find_invalid_utf8(s) == std::string::npos,
                what + " \"" + detail::printable(s) + "\" is not valid UTF-8", path,
                "safetensors headers are UTF-8 JSON");
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorBytes> bytes;
  for (const auto& [name, t] : tensors) {
    TIERMOE_CHECK(t.defined(), "tensor is undefined",
                  path + ": tensor '" + detail::printable(name) + "'",
                  "this is a bug in the caller");
    bytes.push_back({name, safetensors_dtype_name(t.dtype()), t.shape(), t.raw(), t.nbytes()});
  }
  save_safetensors(path, bytes, metadata);
}

void save_safetensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const TensorBytes& t : tensors) {
    const std::string& name = t.name;
    std::string where = path + ": tensor '" + detail::printable(name) + "'";
    TIERMOE_CHECK(names.insert(name).second, "duplicate tensor name", where,
                  "each tensor name may appear once in a file");
    TIERMOE_CHECK(name != "__metadata__", "\"__metadata__\" is reserved for the metadata", where,
                  "rename the tensor");
    TIERMOE_CHECK(
        t.nbytes == uint64_t(shape_numel(t.shape)) * safetensors_dtype_bits(t.dtype) / 8 &&
            (t.data || t.nbytes == 0),
        str_of(t.nbytes, " bytes for ", t.dtype, " ", shape_str(t.shape)), where,
        "this is a bug in the caller");
    check_utf8(name, "tensor name", path);
  }
  for (const auto& [key, value] : metadata) {
    check_utf8(key, "metadata key", path);
    check_utf8(value, "metadata value", path);
  }

  // The reference writer's order: wider dtypes first, then by name, which
  // keeps every tensor naturally aligned when packed without padding.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  auto rank = [&](size_t i) { return detail::safetensors_dtype_rank(tensors[i].dtype); };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int ra = rank(a), rb = rank(b);
    return ra != rb ? ra > rb : tensors[a].name < tensors[b].name;
  });

  // ordered_json keeps insertion order, so the header lists __metadata__
  // first and the tensors in data order, as the reference writer does.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorBytes& t = tensors[i];
    nlohmann::ordered_json info = nlohmann::ordered_json::object();
    info["dtype"] = t.dtype;
    info["shape"] = t.shape;
    info["data_offsets"] = {offset, offset + t.nbytes};
    offset += t.nbytes;
    header[t.name] = std::move(info);
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the data starts 8-byte aligned
  TIERMOE_CHECK(text.size() <= detail::kMaxHeaderBytes,
                "header of " + std::to_string(text.size()) + " bytes exceeds the " +
                    std::to_string(detail::kMaxHeaderBytes) + "-byte limit",
                path, "split the tensors over several files (save_checkpoint_tensors shards)");

  AtomicFile file(path);
  uint64_t n = text.size();
  file.write(&n, sizeof n);
  file.write(text.data(), text.size());
  for (size_t i : order) {
    if (tensors[i].nbytes) file.write(tensors[i].data, tensors[i].nbytes);
  }
  file.commit();
}

}  // namespace tiermoe
