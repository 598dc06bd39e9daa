#include "tiermoe/io/tokens.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "tiermoe/core/error.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

class Tokens : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tiermoe_test_tokens_" + std::string(
                ::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  std::string write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // A .npy file with the given header text (padded as numpy pads it) and payload.
  std::string write_npy_raw(const std::string& name, std::string dict, const std::string& payload,
                            int major = 1, int minor = 0) const {
    size_t prefix = major == 1 ? 10 : 12;
    dict.append(64 - (prefix + dict.size() + 1) % 64, ' ');
    dict += '\n';
    std::string b("\x93NUMPY", 6);
    b += char(major);
    b += char(minor);
    uint32_t n = uint32_t(dict.size());
    b.append(reinterpret_cast<const char*>(&n), major == 1 ? 2 : 4);
    return write_raw(name, b + dict + payload);
  }
  // Expects read_tokens to throw an Error naming the file and containing `needle`.
  void expect_reject(const std::string& p, const std::string& needle) const {
    try {
      read_tokens(p);
      ADD_FAILURE() << "no error for " << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), p) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }

  fs::path dir_;
};

template <class T>
std::string le_bytes(std::initializer_list<T> values) {
  std::string out;
  for (T v : values) out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  return out;
}

const std::vector<int32_t> kSample = {0, 1, 2, 65535, 7, 40000, 3};

TEST_F(Tokens, NpyRoundTripsEveryDtypeAndVersion) {
  for (TokenDType dt : {TokenDType::u16, TokenDType::u32, TokenDType::i32, TokenDType::i64}) {
    for (int version : {1, 2, 3}) {
      std::string p = path("t.npy");
      write_npy_tokens(p, kSample, dt, version);
      EXPECT_EQ(read_tokens(p), kSample) << int(dt) << " v" << version;
    }
  }
  std::vector<int32_t> large = {0, 151935, 2'000'000'000};
  write_npy_tokens(path("l.npy"), large, TokenDType::u32);
  EXPECT_EQ(read_tokens(path("l.npy")), large);
  write_npy_tokens(path("e.npy"), {}, TokenDType::i32);
  EXPECT_TRUE(read_tokens(path("e.npy")).empty());
}

// Bytes numpy 2 writes for np.array([1, 2, 3]) with numpy.lib.format.write_array.
TEST_F(Tokens, NpyWriterMatchesNumpyByteForByte) {
  const std::string v1 = std::string("\x93NUMPY\x01\x00v\x00", 10) +
                         "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }" +
                         std::string(60, ' ') + "\n" + le_bytes<uint16_t>({1, 2, 3});
  const std::string v2 = std::string("\x93NUMPY\x02\x00t\x00\x00\x00", 12) +
                         "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }" +
                         std::string(58, ' ') + "\n" + le_bytes<int64_t>({1, 2, 3});
  const std::string v3 = std::string("\x93NUMPY\x03\x00t\x00\x00\x00", 12) +
                         "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }" +
                         std::string(58, ' ') + "\n" + le_bytes<int32_t>({1, 2, 3});
  const std::vector<int32_t> t = {1, 2, 3};
  write_npy_tokens(path("a.npy"), t, TokenDType::u16, 1);
  write_npy_tokens(path("b.npy"), t, TokenDType::i64, 2);
  write_npy_tokens(path("c.npy"), t, TokenDType::i32, 3);
  EXPECT_EQ(slurp(path("a.npy")), v1);
  EXPECT_EQ(slurp(path("b.npy")), v2);
  EXPECT_EQ(slurp(path("c.npy")), v3);
  EXPECT_EQ(read_tokens(write_raw("n.npy", v2)), t);
}

TEST_F(Tokens, LlmcRoundTripsAndHasTheDocumentedLayout) {
  for (TokenDType dt : {TokenDType::u16, TokenDType::u32}) {
    std::string p = path("t.bin");
    write_llmc_tokens(p, kSample, dt);
    EXPECT_EQ(read_tokens(p), kSample);
    std::string b = slurp(p);
    size_t tok = dt == TokenDType::u16 ? 2 : 4;
    ASSERT_EQ(b.size(), 1024 + kSample.size() * tok);
    int32_t header[256];
    std::memcpy(header, b.data(), 1024);
    EXPECT_EQ(header[0], dt == TokenDType::u16 ? 20240520 : 20240801);
    EXPECT_EQ(header[1], dt == TokenDType::u16 ? 1 : 7);
    EXPECT_EQ(header[2], int32_t(kSample.size()));
    for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0);
    uint32_t fourth = 0;
    std::memcpy(&fourth, b.data() + 1024 + 3 * tok, tok);
    EXPECT_EQ(fourth, 65535u);
  }
  std::vector<int32_t> big = {151935, 0};
  write_llmc_tokens(path("b.bin"), big, TokenDType::u32);
  EXPECT_EQ(read_tokens(path("b.bin")), big);
}

TEST_F(Tokens, WritersRejectTokensThatDoNotFit) {
  std::vector<int32_t> wide = {1, 65536};
  EXPECT_THROW(write_npy_tokens(path("w.npy"), wide, TokenDType::u16), Error);
  EXPECT_THROW(write_llmc_tokens(path("w.bin"), wide, TokenDType::u16), Error);
  std::vector<int32_t> negative = {-1};
  EXPECT_THROW(write_npy_tokens(path("n.npy"), negative, TokenDType::u32), Error);
  EXPECT_THROW(write_llmc_tokens(path("i.bin"), kSample, TokenDType::i32), Error);
  EXPECT_FALSE(fs::exists(path("w.npy")));
}

TEST_F(Tokens, RejectsFilesOfNeitherFormat) {
  expect_reject(write_raw("text.bin", "hello world, not tokens"), "not a token file");
  expect_reject(write_raw("empty.bin", ""), "not a token file");
  expect_reject(path("missing.bin"), "cannot open");
}

TEST_F(Tokens, RejectsMalformedNpy) {
  const std::string ok = "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }";
  const std::string payload = le_bytes<uint16_t>({1, 2, 3});
  expect_reject(write_npy_raw("v4.npy", ok, payload, 4, 0), "version 4.0");
  expect_reject(write_npy_raw("v11.npy", ok, payload, 1, 1), "version 1.1");
  expect_reject(write_npy_raw("fortran.npy",
                              "{'descr': '<u2', 'fortran_order': True, 'shape': (3,), }", payload),
                "Fortran order");
  for (const char* descr : {">u2", "<f4", "<u8", "|u1", "<i2"}) {
    expect_reject(write_npy_raw("dtype.npy",
                                std::string("{'descr': '") + descr +
                                    "', 'fortran_order': False, 'shape': (3,), }",
                                payload),
                  std::string("dtype '") + descr + "'");
  }
  expect_reject(write_npy_raw("2d.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 1), }",
                              payload),
                "2 dimensions");
  expect_reject(write_npy_raw("0d.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (), }",
                              le_bytes<uint16_t>({1})),
                "0 dimensions");
  expect_reject(write_npy_raw("short.npy", ok, payload.substr(0, 5)), "truncated");
  expect_reject(write_npy_raw("long.npy", ok, payload + "xx"), "trailing bytes");
  expect_reject(write_npy_raw("nokey.npy", "{'descr': '<u2', 'shape': (3,), }", payload),
                "fortran_order");
  expect_reject(write_npy_raw("extra.npy",
                              "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), 'x': 1, }",
                              payload),
                "'x'");
  expect_reject(write_npy_raw("dup.npy",
                              "{'descr': '<u2', 'descr': '<u2', 'fortran_order': False, "
                              "'shape': (3,), }",
                              payload),
                "repeated");
  expect_reject(write_npy_raw("garbage.npy", "descr=<u2", payload), "malformed .npy header");
  expect_reject(write_npy_raw("after.npy", ok + " x", payload), "after the closing");
  // Cut inside the header.
  std::string whole = slurp(write_npy_raw("full.npy", ok, payload));
  expect_reject(write_raw("cut.npy", whole.substr(0, 40)), "truncated");
  expect_reject(write_raw("cut2.npy", whole.substr(0, 7)), "truncated");
}

TEST_F(Tokens, RejectsNpyValuesOutsideInt32) {
  expect_reject(write_npy_raw("i8.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                              le_bytes<int64_t>({5, int64_t(1) << 31})),
                "offset 1");
  expect_reject(write_npy_raw("u4.npy", "{'descr': '<u4', 'fortran_order': False, 'shape': (1,), }",
                              le_bytes<uint32_t>({0x80000000u})),
                "offset 0");
}

TEST_F(Tokens, RejectsMalformedLlmc) {
  auto header = [](int32_t magic, int32_t version, int32_t ntok) {
    std::string h(1024, '\0');
    int32_t f[3] = {magic, version, ntok};
    std::memcpy(h.data(), f, sizeof f);
    return h;
  };
  const std::string four_u16 = le_bytes<uint16_t>({1, 2, 3, 4});
  EXPECT_EQ(read_tokens(write_raw("ok.bin", header(20240520, 1, 4) + four_u16)),
            (std::vector<int32_t>{1, 2, 3, 4}));
  expect_reject(write_raw("ver.bin", header(20240520, 7, 4) + four_u16), "version 7");
  expect_reject(write_raw("ver2.bin", header(20240801, 1, 2) + four_u16), "version 1");
  expect_reject(write_raw("more.bin", header(20240520, 1, 5) + four_u16), "truncated");
  expect_reject(write_raw("fewer.bin", header(20240520, 1, 3) + four_u16), "trailing bytes");
  expect_reject(write_raw("neg.bin", header(20240520, 1, -1) + four_u16), "negative");
  expect_reject(write_raw("hdr.bin", header(20240520, 1, 0).substr(0, 500)), "truncated");
  expect_reject(write_raw("u32.bin", header(20240801, 7, 1) + le_bytes<uint32_t>({0xffffffffu})),
                "offset 0");
}

TEST_F(Tokens, ValidateNamesTheOffsetOfAnOutOfVocabularyToken) {
  std::vector<int32_t> ok = {0, 5, 255};
  EXPECT_NO_THROW(validate_tokens(ok, 256, "data.bin"));
  for (auto [bad, offset] : {std::pair{std::vector<int32_t>{0, 256, 1}, 1},
                             std::pair{std::vector<int32_t>{3, 4, -2}, 2}}) {
    try {
      validate_tokens(bad, 256, "data.bin");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "data.bin");
      EXPECT_NE(std::string(e.what()).find("offset " + std::to_string(offset)), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace tiermoe
