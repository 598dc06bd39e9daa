#include "tiermoe/io/tokens.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"

namespace tiermoe {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and read without byte swapping");

namespace {

using detail::str_of;

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr size_t kNpyMagicLen = 6;
constexpr size_t kLlmcHeaderBytes = 1024;
// numpy.load refuses larger headers by default (max_header_size).
constexpr uint64_t kNpyMaxHeaderBytes = 10000;

size_t token_size(TokenDType dt) {
  switch (dt) {
    case TokenDType::u16: return 2;
    case TokenDType::u32: return 4;
    case TokenDType::i32: return 4;
    case TokenDType::i64: return 8;
  }
  __builtin_unreachable();
}

const char* npy_descr(TokenDType dt) {
  switch (dt) {
    case TokenDType::u16: return "<u2";
    case TokenDType::u32: return "<u4";
    case TokenDType::i32: return "<i4";
    case TokenDType::i64: return "<i8";
  }
  __builtin_unreachable();
}

std::optional<TokenDType> parse_npy_descr(const std::string& d) {
  for (TokenDType dt : {TokenDType::u16, TokenDType::u32, TokenDType::i32, TokenDType::i64}) {
    if (d == npy_descr(dt)) return dt;
  }
  return std::nullopt;
}

// An open token file: its size and sequential reads that fail with the path.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {
    require_regular_file(path, "token file", "check the path given to --data");
    in_.open(path, std::ios::binary);
    TIERMOE_CHECK(in_.good(), "cannot open token file", path, "check the path given to --data");
    std::error_code ec;
    size_ = std::filesystem::file_size(path, ec);
    TIERMOE_CHECK(!ec, "cannot stat token file: " + ec.message(), path, "");
  }
  uint64_t size() const { return size_; }
  uint64_t pos() const { return pos_; }
  void rewind() {
    in_.seekg(0);
    pos_ = 0;
  }
  void read(void* dst, uint64_t n, const char* what) {
    TIERMOE_CHECK(n <= size_ - pos_,
                  str_of("file is truncated: ", what, " needs ", n, " bytes at offset ", pos_,
                         " but the file has ", size_, " bytes"),
                  path_, "the file was cut short; regenerate it");
    in_.read(static_cast<char*>(dst), std::streamsize(n));
    TIERMOE_CHECK(in_.good(), str_of("read failed at offset ", pos_), path_, "");
    pos_ += n;
  }

 private:
  const std::string& path_;
  std::ifstream in_;
  uint64_t size_ = 0, pos_ = 0;
};

// Reads `count` tokens of `dt` and converts them to int32; a value outside
// int32 is an error naming its offset.
std::vector<int32_t> read_payload(Reader& r, TokenDType dt, uint64_t count,
                                  const std::string& path) {
  const uint64_t need = count * token_size(dt);
  TIERMOE_CHECK(count == 0 || need / count == token_size(dt),
                str_of("token count ", count, " overflows"), path, "the header is corrupt");
  const uint64_t have = r.size() - r.pos();
  TIERMOE_CHECK(have == need,
                str_of(have < need ? "file is truncated: " : "file has trailing bytes: ", count,
                       " tokens of ", token_size(dt), " bytes need ", need,
                       " bytes after the header, found ", have),
                path, "the header's token count and the file size must agree; regenerate the file");
  std::vector<int32_t> out(count);
  auto convert = [&]<class T>() {
    constexpr uint64_t kChunk = 1 << 20;
    std::vector<T> buf;
    for (uint64_t begin = 0; begin < count; begin += kChunk) {
      uint64_t n = std::min(kChunk, count - begin);
      buf.resize(n);
      r.read(buf.data(), n * sizeof(T), "token data");
      for (uint64_t i = 0; i < n; ++i) {
        T v = buf[i];
        if constexpr (sizeof(T) >= 4) {
          TIERMOE_CHECK(v <= T(std::numeric_limits<int32_t>::max()) &&
                            (std::is_unsigned_v<T> || v >= T(std::numeric_limits<int32_t>::min())),
                        str_of("token at offset ", begin + i, " is ", v,
                               ", outside the int32 range of token ids"),
                        path, "token ids must be below 2^31");
        }
        out[begin + i] = int32_t(v);
      }
    }
  };
  switch (dt) {
    case TokenDType::u16: convert.operator()<uint16_t>(); break;
    case TokenDType::u32: convert.operator()<uint32_t>(); break;
    case TokenDType::i32: convert.operator()<int32_t>(); break;
    case TokenDType::i64: convert.operator()<int64_t>(); break;
  }
  return out;
}

// The .npy header dict, e.g. {'descr': '<u2', 'fortran_order': False, 'shape': (3,), }
// parsed as the Python literal it is, accepting only what numpy writes.
class NpyHeaderParser {
 public:
  NpyHeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  struct Header {
    std::string descr;
    bool fortran_order = false;
    std::vector<uint64_t> shape;
  };

  Header parse() {
    Header h;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    skip_ws();
    expect('{');
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = quoted();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr" && !seen_descr) {
        h.descr = quoted(), seen_descr = true;
      } else if (key == "fortran_order" && !seen_fortran) {
        h.fortran_order = boolean(), seen_fortran = true;
      } else if (key == "shape" && !seen_shape) {
        h.shape = tuple(), seen_shape = true;
      } else {
        fail(str_of("unexpected or repeated key '", key, "'"));
      }
      skip_ws();
      if (peek() == ',') ++i_;
      else if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;
    skip_ws();
    if (i_ != s_.size()) fail("text after the closing '}'");
    if (!seen_descr || !seen_fortran || !seen_shape) {
      fail("the header needs 'descr', 'fortran_order' and 'shape'");
    }
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(str_of("malformed .npy header at character ", i_, ": ", what, " (header: ", s_,
                       ")"),
                path_, "write the file with numpy.save");
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char ch) {
    if (peek() != ch) fail(str_of("expected '", ch, "'"));
    ++i_;
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t')) ++i_;
  }
  std::string quoted() {
    char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string");
    size_t end = s_.find(q, i_ + 1);
    if (end == std::string::npos) fail("unterminated string");
    std::string v = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return v;
  }
  bool boolean() {
    if (s_.compare(i_, 4, "True") == 0) return i_ += 4, true;
    if (s_.compare(i_, 5, "False") == 0) return i_ += 5, false;
    fail("expected True or False");
  }
  std::vector<uint64_t> tuple() {
    std::vector<uint64_t> dims;
    expect('(');
    for (;;) {
      skip_ws();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("expected a dimension");
      uint64_t d = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (d > (std::numeric_limits<uint64_t>::max() - 9) / 10) fail("dimension overflows");
        d = d * 10 + uint64_t(s_[i_++] - '0');
      }
      dims.push_back(d);
      skip_ws();
      if (peek() == ',') ++i_;
      else if (peek() != ')') fail("expected ',' or ')' in shape");
    }
    ++i_;
    return dims;
  }

  const std::string& s_;
  const std::string& path_;
  size_t i_ = 0;
};

std::vector<int32_t> read_npy(Reader& r, const std::string& path) {
  std::array<unsigned char, 8> pre{};
  r.read(pre.data(), pre.size(), ".npy magic and version");
  const int major = pre[6], minor = pre[7];
  TIERMOE_CHECK((major == 1 || major == 2 || major == 3) && minor == 0,
                str_of("unsupported .npy format version ", major, ".", minor), path,
                "versions 1.0, 2.0 and 3.0 are supported; write the file with numpy.save");
  uint64_t header_len = 0;
  if (major == 1) {
    uint16_t n;
    r.read(&n, 2, ".npy header length");
    header_len = n;
  } else {
    uint32_t n;
    r.read(&n, 4, ".npy header length");
    header_len = n;
  }
  // Checked before the header is allocated: a 14-byte file may claim 4 GiB.
  TIERMOE_CHECK(header_len <= r.size() - r.pos(),
                str_of("file is truncated: the .npy header claims ", header_len,
                       " bytes but the file has ", r.size() - r.pos(), " after the length field"),
                path,
                "the file was cut short or is not a .npy file; regenerate it with numpy.save");
  TIERMOE_CHECK(header_len <= kNpyMaxHeaderBytes,
                str_of("the .npy header claims ", header_len, " bytes, more than the ",
                       kNpyMaxHeaderBytes, " numpy itself reads"),
                path, "a token array's header is under 200 bytes; regenerate it with numpy.save");
  std::string text(header_len, '\0');
  r.read(text.data(), header_len, ".npy header");
  const auto h = NpyHeaderParser(text, path).parse();

  auto dt = parse_npy_descr(h.descr);
  TIERMOE_CHECK(dt.has_value(), str_of("unsupported .npy dtype '", h.descr, "'"), path,
                "token arrays must be little-endian <u2, <u4, <i4 or <i8 "
                "(e.g. a.astype(np.uint32))");
  TIERMOE_CHECK(!h.fortran_order, ".npy array is stored in Fortran order", path,
                "save a C-ordered array: np.save(path, np.ascontiguousarray(a))");
  TIERMOE_CHECK(h.shape.size() == 1,
                str_of(".npy array has ", h.shape.size(), " dimensions; token files are 1-D"),
                path, "save a flat array: np.save(path, a.reshape(-1))");
  return read_payload(r, *dt, h.shape[0], path);
}

std::vector<int32_t> read_llmc(Reader& r, const std::string& path) {
  std::array<int32_t, 256> header{};
  r.read(header.data(), kLlmcHeaderBytes, "llm.c header");
  const int32_t magic = header[0], version = header[1], ntok = header[2];
  TokenDType dt;
  if (magic == kLlmcMagicU16) {
    TIERMOE_CHECK(version == 1, str_of("llm.c magic ", magic, " with version ", version), path,
                  "magic 20240520 (uint16 tokens) goes with version 1");
    dt = TokenDType::u16;
  } else {
    TIERMOE_ASSERT(magic == kLlmcMagicU32);
    TIERMOE_CHECK(version == 7, str_of("llm.c magic ", magic, " with version ", version), path,
                  "magic 20240801 (uint32 tokens) goes with version 7");
    dt = TokenDType::u32;
  }
  TIERMOE_CHECK(ntok >= 0, str_of("llm.c header holds a negative token count ", ntok), path,
                "the header is corrupt; regenerate the file");
  return read_payload(r, dt, uint64_t(ntok), path);
}

// Appends the tokens as `dt`, checking each fits.
void append_tokens(std::string& out, std::span<const int32_t> tokens, TokenDType dt,
                   const std::string& path) {
  const size_t size = token_size(dt);
  const size_t base = out.size();
  out.resize(base + tokens.size() * size);
  char* dst = out.data() + base;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    const bool fits = dt == TokenDType::i32 || dt == TokenDType::i64 ||
                      (t >= 0 && (dt == TokenDType::u32 || t <= 0xffff));
    TIERMOE_CHECK(fits, str_of("token ", t, " at offset ", i, " does not fit ", npy_descr(dt)),
                  path, "choose a wider dtype (uint32 for vocabularies above 65536)");
    switch (dt) {
      case TokenDType::u16: { uint16_t v = uint16_t(t); std::memcpy(dst + i * 2, &v, 2); break; }
      case TokenDType::u32: { uint32_t v = uint32_t(t); std::memcpy(dst + i * 4, &v, 4); break; }
      case TokenDType::i32: std::memcpy(dst + i * 4, &t, 4); break;
      case TokenDType::i64: { int64_t v = t; std::memcpy(dst + i * 8, &v, 8); break; }
    }
  }
}

}  // namespace

std::vector<int32_t> read_tokens(const std::string& path) {
  Reader r(path);
  std::array<char, 6> probe{};
  const uint64_t n = std::min<uint64_t>(r.size(), probe.size());
  r.read(probe.data(), n, "magic");
  r.rewind();
  if (n == kNpyMagicLen && std::memcmp(probe.data(), kNpyMagic, kNpyMagicLen) == 0) {
    return read_npy(r, path);
  }
  int32_t magic = 0;
  if (n >= 4) std::memcpy(&magic, probe.data(), 4);
  if (n >= 4 && (magic == kLlmcMagicU16 || magic == kLlmcMagicU32)) return read_llmc(r, path);
  throw Error("not a token file: neither the .npy magic nor an llm.c header magic", path,
              "token files are NumPy .npy arrays or llm.c .bin shards (magic 20240520 or "
              "20240801)");
}

void validate_tokens(std::span<const int32_t> tokens, int64_t vocab, const std::string& path) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    TIERMOE_CHECK(t >= 0 && t < vocab,
                  str_of("token at offset ", i, " is ", t, ", outside the vocabulary [0, ", vocab,
                         ")"),
                  path, "the data was tokenized for another vocabulary than the model's");
  }
}

void write_npy_tokens(const std::string& path, std::span<const int32_t> tokens, TokenDType dtype,
                      int version) {
  TIERMOE_CHECK(version >= 1 && version <= 3, str_of(".npy version ", version, " requested"), path,
                "versions 1, 2 and 3 exist");
  std::string dict = str_of("{'descr': '", npy_descr(dtype), "', 'fortran_order': False, 'shape': (",
                            tokens.size(), ",), }");
  // As numpy.lib.format does: spaces and a final newline so the data starts
  // 64-byte aligned (a full 64 spaces when it already would be).
  const size_t prefix = kNpyMagicLen + 2 + (version == 1 ? 2 : 4);
  dict.append(64 - (prefix + dict.size() + 1) % 64, ' ');
  dict += '\n';

  std::string out(kNpyMagic, kNpyMagicLen);
  out += char(version);
  out += char(0);
  if (version == 1) {
    TIERMOE_ASSERT(dict.size() <= 0xffff);
    uint16_t n = uint16_t(dict.size());
    out.append(reinterpret_cast<const char*>(&n), 2);
  } else {
    uint32_t n = uint32_t(dict.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
  }
  out += dict;
  append_tokens(out, tokens, dtype, path);
  write_file_atomic(path, out);
}

void write_llmc_tokens(const std::string& path, std::span<const int32_t> tokens,
                       TokenDType dtype) {
  TIERMOE_CHECK(dtype == TokenDType::u16 || dtype == TokenDType::u32,
                "llm.c token files hold uint16 or uint32 tokens", path,
                "use TokenDType::u16 (GPT-2 format) or TokenDType::u32 (Llama-3 format)");
  TIERMOE_CHECK(tokens.size() < (size_t(1) << 31),
                str_of(tokens.size(), " tokens do not fit one llm.c shard"), path,
                "llm.c shards hold fewer than 2^31 tokens; split the data");
  std::array<int32_t, 256> header{};
  header[0] = dtype == TokenDType::u16 ? kLlmcMagicU16 : kLlmcMagicU32;
  header[1] = dtype == TokenDType::u16 ? 1 : 7;
  header[2] = int32_t(tokens.size());
  std::string out(reinterpret_cast<const char*>(header.data()), kLlmcHeaderBytes);
  append_tokens(out, tokens, dtype, path);
  write_file_atomic(path, out);
}

}  // namespace tiermoe
