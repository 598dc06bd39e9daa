#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "safetensors_common.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {

using nlohmann::json;

// The whole file, mapped copy-on-write: a caller writing into a view changes
// only its private pages, never the file. Views hold a shared_ptr to this.
struct SafetensorsFile::Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base) ::munmap(base, size);
  }
  const std::byte* bytes() const { return static_cast<const std::byte*>(base); }
};

namespace {

constexpr const char* kCorrupt = "the file is corrupt or truncated; re-download or re-export it";

// Built step by step: GCC 12 warns falsely (-Wrestrict) on "'" + string&&.
std::string quoted(const std::string& name) {
  std::string s = "'";
  s += detail::printable(name);
  s += "'";
  return s;
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

// Reads a non-negative JSON integer within the schema's 2^48-1 bound;
// returns what is wrong with `v` otherwise.
std::string schema_uint(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return out <= detail::kMaxSchemaInt ? "" : "exceeds the schema's limit 2^48-1";
  }
  if (v.is_number_integer()) {
    out = 0;
    return v.get<int64_t>() == 0 ? "" : "is negative";  // "-0" is an integer zero
  }
  return v.is_number() ? "is not an integer" : "is not a number";
}

SafetensorsEntry parse_entry(const std::string& name, const json& info, const std::string& where) {
  const std::string hint = "tensor entries are {\"dtype\": str, \"shape\": [int...], "
                           "\"data_offsets\": [begin, end]}";
  TIERMOE_CHECK(info.is_object(), "tensor entry is not a JSON object (schema)", where, hint);
  // Stricter than the Rust reader, which ignores unknown fields: the schema
  // forbids them, and a field we would ignore may carry meaning (strides).
  for (const auto& [key, value] : info.items()) {
    TIERMOE_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
                  "tensor entry has an unknown field \"" + detail::printable(key) + "\" (schema)",
                  where, hint);
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    TIERMOE_CHECK(info.contains(key),
                  std::string("tensor entry is missing field \"") + key + "\" (schema)", where,
                  hint);
  }
  SafetensorsEntry e;
  e.name = name;
  const json& dtype = info["dtype"];
  TIERMOE_CHECK(dtype.is_string(), "dtype is not a string (schema)", where, hint);
  e.dtype = dtype.get<std::string>();
  TIERMOE_CHECK(detail::safetensors_dtype_rank(e.dtype) >= 0,
                "unknown dtype \"" + detail::printable(e.dtype) + "\"", where,
                "known dtypes: BOOL, F4, F6_*, U8, I8, F8_*, I16, U16, F16, BF16, I32, U32, F32, "
                "C64, F64, I64, U64");

  const json& shape = info["shape"];
  TIERMOE_CHECK(shape.is_array(), "shape is not a list (schema)", where, hint);
  for (const json& d : shape) {
    uint64_t dim = 0;
    std::string bad = schema_uint(d, dim);
    TIERMOE_CHECK(bad.empty(),
                  "shape " + detail::printable(shape.dump()) + ": dimension " +
                      detail::printable(d.dump()) + " " + bad,
                  where, "dimensions are integers in [0, 2^48-1]");
    e.shape.push_back(int64_t(dim));
  }

  const json& offsets = info["data_offsets"];
  std::string offsets_text = detail::printable(offsets.dump());
  TIERMOE_CHECK(offsets.is_array() && offsets.size() == 2,
                "data_offsets " + offsets_text + " is not a list of two integers [begin, end]",
                where, hint);
  for (int i = 0; i < 2; ++i) {
    std::string bad = schema_uint(offsets[i], i == 0 ? e.begin : e.end);
    TIERMOE_CHECK(bad.empty(), "data_offsets " + offsets_text + ": " +
                                   (i == 0 ? "begin " : "end ") + bad,
                  where, hint);
  }
  return e;
}

// The reference checks, in its order: coverage of the data buffer in offset
// order, then each tensor's byte size against its shape and dtype.
void check_layout(std::vector<SafetensorsEntry>& entries, uint64_t data_bytes,
                  const std::string& path) {
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
  });
  uint64_t expected = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : entries) {
    std::string where = path + ": tensor " + quoted(e.name);
    std::string range =
        "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    TIERMOE_CHECK(e.end >= e.begin, range + " has end < begin", where, kCorrupt);
    if (!prev) {
      TIERMOE_CHECK(e.begin == 0,
                    "first tensor does not start at offset 0 (" + range +
                        "): a gap before the first tensor",
                    where, kCorrupt);
    } else {
      std::string after = " the previous tensor " + quoted(prev->name) + " which ends at " +
                          std::to_string(expected);
      TIERMOE_CHECK(e.begin >= expected, range + " overlap" + after, where, kCorrupt);
      TIERMOE_CHECK(e.begin <= expected, range + " leave a gap after" + after, where, kCorrupt);
    }

    uint64_t numel = 1, bits = 0;
    for (int64_t d : e.shape) {
      TIERMOE_CHECK(!__builtin_mul_overflow(numel, uint64_t(d), &numel),
                    "shape " + shape_str(e.shape) + " overflows the element count", where,
                    kCorrupt);
    }
    TIERMOE_CHECK(!__builtin_mul_overflow(numel, safetensors_dtype_bits(e.dtype), &bits),
                  "shape " + shape_str(e.shape) + " overflows the bit count", where, kCorrupt);
    TIERMOE_CHECK(bits % 8 == 0,
                  "shape " + shape_str(e.shape) + " of " + e.dtype + " is " +
                      std::to_string(bits) + " bits, not a whole number of bytes (misaligned)",
                  where, kCorrupt);
    TIERMOE_CHECK(e.end - e.begin == bits / 8,
                  "size mismatch: " + range + " hold " + std::to_string(e.end - e.begin) +
                      " bytes but " + e.dtype + shape_str(e.shape) + " needs " +
                      std::to_string(bits / 8),
                  where, kCorrupt);
    expected = e.end;
    prev = &e;
  }
  TIERMOE_CHECK(expected <= data_bytes,
                "data truncated: tensors need " + std::to_string(expected) +
                    " data bytes but the file holds " + std::to_string(data_bytes),
                path, kCorrupt);
  TIERMOE_CHECK(expected >= data_bytes,
                std::to_string(data_bytes - expected) +
                    " trailing bytes after the last tensor (the data must end the file)",
                path, kCorrupt);
}

DType tiermoe_dtype(const SafetensorsEntry& e, const std::string& path) {
  if (e.dtype == "F64") return DType::f64;
  if (e.dtype == "F32") return DType::f32;
  if (e.dtype == "BF16") return DType::bf16;
  throw Error("tensor has dtype " + e.dtype + "; view/load support F64, F32 and BF16 only",
              path + ": tensor " + quoted(e.name), "read its raw bytes with bytes() instead");
}

}  // namespace

std::shared_ptr<SafetensorsFile::Mapping> SafetensorsFile::map_file(const std::string& path) {
  const int fd = open_regular_file(path, "safetensors file", "pass a .safetensors file");
  struct stat st {};
  ::fstat(fd, &st);
  auto map = std::make_shared<Mapping>();
  map->size = size_t(st.st_size);
  if (map->size < 8) {
    ::close(fd);
    throw Error("file too short: " + std::to_string(map->size) +
                    " bytes, shorter than the 8-byte header length",
                path, kCorrupt);
  }
  // Writable private pages only cost commit charge once written; if the
  // kernel still refuses (strict overcommit, huge file) read-only will do.
  void* base = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED && errno == ENOMEM) {
    base = ::mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
  }
  int map_errno = errno;
  ::close(fd);
  TIERMOE_CHECK(base != MAP_FAILED, std::string("mmap failed: ") + std::strerror(map_errno), path,
                "check free address space and file permissions");
  map->base = base;
  return map;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = map_file(path);
  const std::byte* base = f.map_->bytes();
  const uint64_t size = f.map_->size;

  const uint64_t n = read_le64(base);
  TIERMOE_CHECK(n <= detail::kMaxHeaderBytes,
                "header too large: header length " + std::to_string(n) + " exceeds the " +
                    std::to_string(detail::kMaxHeaderBytes) + "-byte limit",
                path, kCorrupt);
  TIERMOE_CHECK(8 + n <= size,
                "header length " + std::to_string(n) + " runs past the end of the " +
                    std::to_string(size) + "-byte file",
                path, kCorrupt);

  // Schema depth: header object > tensor entry > shape list.
  std::string_view text(reinterpret_cast<const char*>(base + 8), size_t(n));
  json header = detail::parse_json_strict(text, 3, path, "safetensors header");
  TIERMOE_CHECK(header.is_object(), "safetensors header is not a JSON object", path,
                "the header must be {\"name\": {...}, ...}");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;  // serde reads a null Option as absent
      TIERMOE_CHECK(value.is_object(), "__metadata__ is not an object of strings", path,
                    "__metadata__ must map strings to strings");
      for (const auto& [mkey, mval] : value.items()) {
        TIERMOE_CHECK(mval.is_string(),
                      "__metadata__ value for \"" + detail::printable(mkey) +
                          "\" is not a string: " + detail::printable(mval.dump()),
                      path, "__metadata__ must map strings to strings");
        f.metadata_[mkey] = mval.get<std::string>();
      }
      continue;
    }
    f.entries_.push_back(parse_entry(key, value, path + ": tensor " + quoted(key)));
  }
  check_layout(f.entries_, size - 8 - n, path);
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  f.data_offset_ = 8 + n;
  return f;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) > 0; }

void SafetensorsFile::read_prefix_as(const std::string& stored, const std::string& as) {
  for (SafetensorsEntry& e : entries_) {
    if (!e.name.starts_with(stored)) continue;
    std::string renamed = as + e.name.substr(stored.size());
    TIERMOE_CHECK(!index_.count(renamed),
                  "tensor " + quoted(std::as_const(e.name)) + " would be read as " +
                      quoted(std::as_const(renamed)) + ", which the file also holds",
                  path_, "a checkpoint holds a model under one of the two names, not both");
    index_.erase(e.name);
    index_[renamed] = size_t(&e - entries_.data());
    e.name = std::move(renamed);
  }
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  TIERMOE_CHECK(it != index_.end(), "no tensor " + quoted(name) + " in this file", path_,
                "list the file's tensors with `tiermoe inspect " + path_ + "`");
  return entries_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return {map_->bytes() + data_offset_ + e.begin, size_t(e.nbytes())};
}

void SafetensorsFile::release(const std::string& name) const {
  const auto b = bytes(name);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(b.data()) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(b.data()) + b.size()) / page * page;
  // Advice only: a failure leaves the pages resident, nothing else changes.
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

uint64_t SafetensorsFile::file_size() const { return map_ ? map_->size : 0; }

Tensor SafetensorsFile::view(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  DType dtype = tiermoe_dtype(e, path_);
  auto* data = const_cast<std::byte*>(map_->bytes() + data_offset_ + e.begin);
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0) {
    return Tensor::from_external(data, e.shape, dtype, map_);
  }
  // Other writers may leave the data unaligned for its dtype; a typed pointer
  // there is undefined behaviour, so such tensors come back as a copy.
  Tensor t = Tensor::empty(e.shape, dtype, MemTag::weights);
  if (t.nbytes()) std::memcpy(t.raw(), data, t.nbytes());
  return t;
}

Tensor SafetensorsFile::load(const std::string& name, DType dtype, MemTag tag) const {
  return view(name).to(dtype, tag);
}

}  // namespace tiermoe
