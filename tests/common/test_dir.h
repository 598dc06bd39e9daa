#pragma once
// A test with a directory of its own under the temp dir, named after the
// test and empty at the start, removed at the end; with `threads` > 0 the
// process runs the test on that many threads (and on all of them after).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "tiermoe/core/parallel.h"

namespace tiermoe::testing {

// The names in directory d.
inline std::set<std::string> dir_entries(const std::filesystem::path& d) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(d)) {
    out.insert(e.path().filename().string());
  }
  return out;
}

class DirTest : public ::testing::Test {
 protected:
  explicit DirTest(std::string prefix, int threads = 0)
      : prefix_(std::move(prefix)), threads_(threads) {}
  void SetUp() override {
    if (threads_ > 0) set_num_threads(threads_);
    dir_ = std::filesystem::temp_directory_path() /
           (prefix_ + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    if (threads_ > 0) set_num_threads(0);
  }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
  int threads_;
};

}  // namespace tiermoe::testing
