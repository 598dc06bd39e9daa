#pragma once
// Helpers shared by the safetensors reader, writer and sharded index: the
// dtype table and strict JSON parsing (UTF-8 checked, duplicate keys
// rejected). Private to src/io.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tiermoe::detail {

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference MAX_HEADER_SIZE
inline constexpr uint64_t kMaxSchemaInt = (uint64_t(1) << 48) - 1;

// Position of `dtype` in the reference enum, which is ordered by increasing
// alignment; -1 for an unknown string. The writer sorts on this rank.
int safetensors_dtype_rank(std::string_view dtype);

// Returns the offset of the first byte that is not well-formed UTF-8 (the
// rules of Rust's str::from_utf8: no overlongs, surrogates or code points past
// U+10FFFF), or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

// A name or key made safe to print: control characters replaced and long
// names shortened, so a hostile file cannot garble an error message.
std::string printable(std::string_view s);

// Parses UTF-8 JSON text, rejecting invalid UTF-8, duplicate object keys (at
// any depth) and nesting deeper than `max_depth` containers. `where` names the
// file; `what` names the document ("safetensors header", "index").
nlohmann::json parse_json_strict(std::string_view text, int max_depth, const std::string& where,
                                 const std::string& what);

// The whole contents of a (small) file; throws an Error naming `path`.
std::string read_small_file(const std::string& path, uint64_t max_bytes);

}  // namespace tiermoe::detail
