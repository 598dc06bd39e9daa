#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

TEST(Bounds, CheckedArithmeticThrowsOnOverflowOnly) {
  EXPECT_EQ(checked_mul(int64_t(1) << 31, int64_t(1) << 31, "x", "w"), int64_t(1) << 62);
  EXPECT_EQ(checked_add(INT64_MAX - 1, 1, "x", "w"), INT64_MAX);
  EXPECT_EQ(checked_product({3, 5, 7}, "x", "w"), 105);
  EXPECT_EQ(checked_product({}, "x", "w"), 1);
  try {
    checked_product({int64_t(1) << 32, int64_t(1) << 20, int64_t(1) << 12}, "the count", "here");
    ADD_FAILURE() << "no overflow";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "here");
    EXPECT_NE(std::string(e.what()).find("the count overflows"), std::string::npos) << e.what();
  }
  EXPECT_THROW(checked_add(INT64_MAX, 1, "x", "w"), Error);
}

TEST(Bounds, RangeNamesTheFlagAndTheRange) {
  check_in_range(5, 1, 5, "--n", "");
  try {
    check_in_range(0, 1, 5, "--n", "at least one");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "--n");
    EXPECT_NE(std::string(e.what()).find("outside [1, 5]"), std::string::npos) << e.what();
    EXPECT_EQ(e.hint(), "at least one");
  }
}

TEST(Bounds, HostMemoryIsReadAndChecked) {
  const uint64_t available = host_memory_available();
  EXPECT_GT(available, uint64_t(1) << 20);
  check_host_memory(1024, "a small run", "w", "");
  try {
    check_host_memory(UINT64_MAX, "a huge run", "--layers", "use fewer");
    ADD_FAILURE() << "2^64 bytes accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "--layers");
    EXPECT_NE(std::string(e.what()).find("a huge run needs at least"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("are available"), std::string::npos) << e.what();
  }
  EXPECT_EQ(format_size(61'060'000'000), "61.06 GB");
  EXPECT_EQ(format_size(19'966'910'000'000), "19966.91 GB");
  EXPECT_EQ(format_size(3'200'000), "3.20 MB");
  EXPECT_EQ(format_size(512), "512 B");
}

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / "tiermoe_test_core_files";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ::alarm(60);  // a blocking open would hang the suite: fail instead
  }
  void TearDown() override {
    ::alarm(0);
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(Files, RegularFilesOpenAndEverythingElseIsNamed) {
  const std::string file = (dir_ / "f").string(), pipe = (dir_ / "p").string();
  std::ofstream(file) << "x";
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);

  const int fd = open_regular_file(file, "test file", "");
  EXPECT_GE(fd, 0);
  char c = 0;
  EXPECT_EQ(::read(fd, &c, 1), 1);  // blocking reads again after the O_NONBLOCK open
  EXPECT_EQ(c, 'x');
  ::close(fd);
  require_regular_file(file, "test file", "");

  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const std::string& m : {message([&] { open_regular_file(pipe, "data file", "h"); }),
                               message([&] { require_regular_file(pipe, "data file", "h"); })}) {
    EXPECT_NE(m.find("data file is a FIFO"), std::string::npos) << m;
    EXPECT_NE(m.find(pipe), std::string::npos) << m;
  }
  EXPECT_NE(message([&] { open_regular_file(dir_.string(), "x", ""); }).find("a directory"),
            std::string::npos);
  EXPECT_NE(message([&] { require_regular_file("/dev/null", "x", ""); }).find("character device"),
            std::string::npos);
  EXPECT_NE(message([&] {
              require_regular_file((dir_ / "none").string(), "x", "");
            }).find("cannot open x"),
            std::string::npos);
}

}  // namespace
}  // namespace tiermoe
