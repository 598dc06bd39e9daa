// write_file_atomic (core/files.h): a small file is replaced whole or not at
// all. A write that fails part way (here the file-size limit, EFBIG, the
// failure a writer meets on a full disk) keeps the old file and leaves no
// PATH.tmp behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

class WriteFileAtomic : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tiermoe_files_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(WriteFileAtomic, ReplacesTheFileWhole) {
  const std::string path = (dir_ / "config.json").string();
  write_file_atomic(path, "old");
  write_file_atomic(path, "new contents");
  EXPECT_EQ(slurp(path), "new contents");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST_F(WriteFileAtomic, AFailedWriteKeepsTheOldFileAndLeavesNoTemporary) {
  const std::string path = (dir_ / "config.json").string();
  write_file_atomic(path, "old");
  // In a child: the limit would also stop gtest's own output in this process.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit tiny{1, 1};
    ::setrlimit(RLIMIT_FSIZE, &tiny);
    try {
      write_file_atomic(path, std::string(100000, 'x'));
    } catch (const Error& e) {
      ::_exit(std::string(e.what()).find("write failed") != std::string::npos ? 0 : 3);
    }
    ::_exit(2);  // no error: the limit did not bite
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: the write did not fail; 3: another error";
  EXPECT_EQ(slurp(path), "old");
  EXPECT_FALSE(fs::exists(path + ".tmp")) << "the temporary file was left behind";
}

}  // namespace
}  // namespace tiermoe
