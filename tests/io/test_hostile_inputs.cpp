// Files that lie about their sizes or are not files at all: each is refused
// with an Error naming the file, before anything is allocated or opened in a
// way that blocks.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/memory_cap.h"
#include "tiermoe/core/error.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/sft_jsonl.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

class HostileInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tiermoe_test_hostile_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A reader that opens a FIFO blocking would hang the suite: fail instead.
    ::alarm(60);
  }
  void TearDown() override {
    ::alarm(0);
    fs::remove_all(dir_);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  std::string fifo(const std::string& name) const {
    EXPECT_EQ(::mkfifo(path(name).c_str(), 0600), 0);
    return path(name);
  }

  fs::path dir_;
};

// The Error `fn` throws; a test failure when it throws none.
template <class Fn>
Error error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no Error thrown";
  return Error("none");
}

TEST_F(HostileInputs, NpyHeaderLongerThanTheFileIsRefusedBeforeItIsAllocated) {
  // 14 bytes: magic, version 2.0, a header length of 2^32 - 1, two bytes.
  std::string b("\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14);
  const std::string p = write("big_header.npy", b);
  if (!testing::kCanCapMemory) GTEST_SKIP() << "no address-space cap under AddressSanitizer";
  // With 256 MiB to spare, allocating the 4 GiB header would throw bad_alloc.
  const int rc = testing::run_with_memory_cap(uint64_t(256) << 20, [&] {
    try {
      read_tokens(p);
    } catch (const Error& e) {
      const std::string what = e.what();
      return e.where() == p && what.find("header claims 4294967295 bytes") != std::string::npos ? 0
                                                                                                : 1;
    }
    return 1;
  });
  EXPECT_EQ(rc, 0) << "1: another error, 3: bad_alloc, -1: crashed";
}

TEST_F(HostileInputs, NpyHeaderLargerThanNumpyReadsIsRefused) {
  std::string b("\x93NUMPY\x02\x00", 8);
  const uint32_t n = 20000;
  b.append(reinterpret_cast<const char*>(&n), 4);
  b += std::string(n, ' ');
  const Error e = error_of([&] { read_tokens(write("wide.npy", b)); });
  EXPECT_EQ(e.where(), path("wide.npy"));
  EXPECT_NE(std::string(e.what()).find("more than the 10000"), std::string::npos) << e.what();
}

TEST_F(HostileInputs, FifosAreRefusedNotOpened) {
  const std::string p = fifo("pipe");
  for (auto* reader : {+[](const std::string& f) { read_tokens(f); },
                       +[](const std::string& f) { SafetensorsFile::open(f); },
                       +[](const std::string& f) { load_model_config(f); },
                       +[](const std::string& f) { read_sft_jsonl(f); },
                       +[](const std::string& f) { is_sft_jsonl(f); }}) {
    const Error e = error_of([&] { reader(p); });
    EXPECT_EQ(e.where(), p) << e.what();
    EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
  }
  // A checkpoint directory whose config.json is a FIFO.
  fs::create_directories(dir_ / "ckpt");
  fifo("ckpt/config.json");
  const Error e = error_of([&] { load_model_config(path("ckpt")); });
  EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
}

TEST_F(HostileInputs, JsonNumberOverflowNamesTheFile) {
  const Error config = error_of([&] {
    parse_model_config(R"({"model_type": "qwen3_moe", "rope_theta": 1e999})", "m/config.json");
  });
  EXPECT_EQ(config.where(), "m/config.json") << config.what();
  EXPECT_NE(std::string(config.what()).find("1e999"), std::string::npos) << config.what();

  const std::string header = R"({"x": {"dtype": "F32", "shape": [1e999], "data_offsets": [0, 4]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  const std::string p = write("overflow.safetensors", file + header + std::string(4, '\0'));
  const Error st = error_of([&] { SafetensorsFile::open(p); });
  EXPECT_EQ(st.where(), p) << st.what();
  EXPECT_NE(std::string(st.what()).find("not valid JSON"), std::string::npos) << st.what();
}

}  // namespace
}  // namespace tiermoe
