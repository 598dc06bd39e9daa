#pragma once
// Pre-tokenized training data: NumPy .npy arrays and llm.c
// .bin shards. The format is recognised by the file's magic bytes, not its
// extension. Tokens come back as int32 (every supported vocabulary is below
// 2^31); a value that does not fit, a malformed header or a size mismatch is
// an Error naming the file.
//
// .npy: header versions 1.0, 2.0 and 3.0; dtypes <u2, <u4, <i4, <i8; C order;
// one dimension. A 2-D array is rejected rather than flattened, because rows
// of windows joined end to end would silently form token pairs that never
// occurred in the data (hint: save a.reshape(-1) if that is what you want).
// The data must fill the rest of the file exactly.
//
// llm.c .bin: a 1024-byte header of 256 little-endian int32 (magic, version,
// token count, zeros), then the tokens: magic 20240520 version 1 is uint16
// (GPT-2), magic 20240801 version 7 is uint32 (Llama 3). The file size must
// be exactly 1024 + count * token size.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tiermoe {

enum class TokenDType : uint8_t { u16, u32, i32, i64 };

inline constexpr int32_t kLlmcMagicU16 = 20240520;  // version 1
inline constexpr int32_t kLlmcMagicU32 = 20240801;  // version 7

std::vector<int32_t> read_tokens(const std::string& path);

// Throws when a token is negative or >= vocab, naming the file and the
// token's offset (its index in the file's token stream).
void validate_tokens(std::span<const int32_t> tokens, int64_t vocab, const std::string& path);

// Writers (tests, the demo, data preparation). Both write atomically and
// throw when a token does not fit the chosen dtype.
void write_npy_tokens(const std::string& path, std::span<const int32_t> tokens, TokenDType dtype,
                      int version = 1);
// u16 writes the GPT-2 format (magic 20240520 v1), u32 the Llama-3 one (20240801 v7).
void write_llmc_tokens(const std::string& path, std::span<const int32_t> tokens, TokenDType dtype);

}  // namespace tiermoe
