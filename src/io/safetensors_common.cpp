#include "safetensors_common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <unordered_set>
#include <vector>

#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {

namespace {

struct DtypeInfo {
  std::string_view name;
  uint64_t bits;
};

// The reference `Dtype` enum, in its declaration order (increasing alignment).
constexpr std::array<DtypeInfo, 22> kDtypes = {{
    {"BOOL", 8},        {"F4", 4},          {"F6_E2M3", 6},     {"F6_E3M2", 6},
    {"U8", 8},          {"I8", 8},          {"F8_E5M2", 8},     {"F8_E4M3", 8},
    {"F8_E8M0", 8},     {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
    {"U16", 16},        {"F16", 16},        {"BF16", 16},       {"I32", 32},
    {"U32", 32},        {"F32", 32},        {"C64", 64},        {"F64", 64},
    {"I64", 64},        {"U64", 64},
}};

}  // namespace

uint64_t safetensors_dtype_bits(const std::string& dtype) {
  int rank = detail::safetensors_dtype_rank(dtype);
  TIERMOE_CHECK(rank >= 0, "unknown safetensors dtype \"" + detail::printable(dtype) + "\"", "",
                "known dtypes: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_*, I16, U16, F16, BF16, "
                "I32, U32, F32, C64, F64, I64, U64");
  return kDtypes[size_t(rank)].bits;
}

std::string safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
  }
  __builtin_unreachable();
}

namespace detail {

int safetensors_dtype_rank(std::string_view dtype) {
  for (size_t i = 0; i < kDtypes.size(); ++i) {
    if (kDtypes[i].name == dtype) return int(i);
  }
  return -1;
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

std::string printable(std::string_view s) {
  constexpr size_t kMax = 96;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    out += (c < 0x20 || c == 0x7F) ? '?' : char(c);
  }
  if (s.size() > kMax) out += "...";
  return out;
}

nlohmann::json parse_json_strict(std::string_view text, int max_depth, const std::string& where,
                                 const std::string& what) {
  size_t bad = find_invalid_utf8(text);
  TIERMOE_CHECK(bad == std::string_view::npos,
                what + " is not valid UTF-8 (bad byte at offset " + std::to_string(bad) + ")",
                where, "the file is corrupt or not in this format");

  using json = nlohmann::json;
  // nlohmann keeps the last of duplicate keys silently; the callback sees
  // every key, so one set of seen keys per open object catches them.
  std::vector<std::unordered_set<std::string>> seen;
  std::vector<std::string> open_keys;  // the key under which each open object sits
  std::string last_key;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        TIERMOE_CHECK(int(open_keys.size()) < max_depth,
                      what + " is nested deeper than its schema allows (" +
                          std::to_string(max_depth) + " levels)",
                      where, "the file is corrupt or not in this format");
        open_keys.push_back(last_key);
        if (event == json::parse_event_t::object_start) seen.emplace_back();
        break;
      case json::parse_event_t::object_end:
        seen.pop_back();
        open_keys.pop_back();
        break;
      case json::parse_event_t::array_end:
        open_keys.pop_back();
        break;
      case json::parse_event_t::key: {
        last_key = parsed.get<std::string>();
        bool fresh = seen.back().insert(last_key).second;
        std::string inside =
            open_keys.back().empty() ? "" : " inside \"" + printable(open_keys.back()) + "\"";
        TIERMOE_CHECK(fresh, what + " has a duplicate key \"" + printable(last_key) + "\"" + inside,
                      where, "each key may appear once; the file was written by a broken writer");
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    throw Error(what + " is not valid JSON: " + e.what(), where,
                "the file is corrupt or not in this format");
  }
}

std::string read_small_file(const std::string& path, uint64_t max_bytes) {
  const int fd = open_regular_file(path, "file", "check the path");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    throw Error("not a regular file of at most " + std::to_string(max_bytes) + " bytes", path,
                "check the path");
  }
  std::string text(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += size_t(n);
  }
  ::close(fd);
  TIERMOE_CHECK(got == text.size(), "short read", path, "the file changed while being read");
  return text;
}

}  // namespace detail
}  // namespace tiermoe
