// AtomicFile and write_file_atomic (core/files.h): a file is replaced whole
// or not at all. A write that fails part way (here the file-size limit,
// EFBIG, the failure a writer meets on a full disk) keeps the old file and
// leaves no temporary behind; a user's PATH.tmp is never touched; a mapped
// file is replaced, not truncated under its reader; a directory target is
// an error that leaves nothing; /dev/null is written in place.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
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
  std::set<std::string> entries() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.insert(e.path().filename().string());
    return names;
  }
  fs::path dir_;
};

TEST_F(WriteFileAtomic, ReplacesTheFileWhole) {
  const std::string path = (dir_ / "config.json").string();
  write_file_atomic(path, "old");
  write_file_atomic(path, "new contents");
  EXPECT_EQ(slurp(path), "new contents");
  EXPECT_EQ(entries(), std::set<std::string>{"config.json"});
}

TEST_F(WriteFileAtomic, AUsersTmpFileIsNotTouched) {
  const std::string path = (dir_ / "r.html").string();
  std::ofstream(path + ".tmp") << "the user's";
  write_file_atomic(path, "report");
  EXPECT_EQ(slurp(path), "report");
  EXPECT_EQ(slurp(path + ".tmp"), "the user's");
  EXPECT_EQ(entries(), (std::set<std::string>{"r.html", "r.html.tmp"}));
}

TEST_F(WriteFileAtomic, AMappedFileIsReplacedNotTruncated) {
  const std::string path = (dir_ / "model.safetensors").string();
  write_file_atomic(path, std::string(4096, 'm'));
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = ::mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  write_file_atomic(path, "{}");
  // A truncated mapping would raise SIGBUS here.
  EXPECT_EQ(std::string(static_cast<const char*>(map), 4096), std::string(4096, 'm'));
  ::munmap(map, 4096);
  EXPECT_EQ(slurp(path), "{}");
}

TEST_F(WriteFileAtomic, ADirectoryTargetIsAnErrorThatLeavesNothing) {
  fs::create_directories(dir_ / "out");
  try {
    write_file_atomic((dir_ / "out").string(), "x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("directory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(entries(), std::set<std::string>{"out"});
  EXPECT_TRUE(fs::is_empty(dir_ / "out"));
}

TEST_F(WriteFileAtomic, AnUncommittedFileLeavesNothing) {
  {
    AtomicFile f((dir_ / "x.json").string());
    f.write("abc", 3);
  }
  EXPECT_EQ(entries(), std::set<std::string>{});
}

TEST_F(WriteFileAtomic, DevNullIsWrittenInPlace) {
  write_file_atomic("/dev/null", "gone");
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
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
  EXPECT_EQ(entries(), std::set<std::string>{"config.json"}) << "a temporary file was left behind";
}

}  // namespace
}  // namespace tiermoe
