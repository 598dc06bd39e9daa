#pragma once
// The ep tests run as P ranks under mpirun (CMake registers them with
// `mpirun -np 2`). Every rank runs every test; a test makes the same
// collectives on every rank, so checks that must not stop a test early are
// EXPECTs, and a check whose outcome all ranks must agree on goes through
// all_ranks().
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tiermoe/dist/comm.h"

namespace tiermoe::testing {

// The job's Comm (made by the ep tests' main).
Comm& ep_comm();

// Whether `ok` holds on every rank (a collective).
inline bool all_ranks(bool ok) {
  for (int64_t v : ep_comm().allgather_value(int64_t(ok), "test verdict")) {
    if (!v) return false;
  }
  return true;
}

// A test (or a parameterised one: Base) with one directory for the job under
// the temp dir, named after the test: every rank uses the same path, and
// rank 0 empties it before and removes it after, between barriers.
template <class Base = ::testing::Test>
class EpDirTest : public Base {
 protected:
  explicit EpDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           (prefix_ + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    if (ep_comm().rank() == 0) {
      std::filesystem::remove_all(dir_);
      std::filesystem::create_directories(dir_);
    }
    ep_comm().barrier("test set-up");
  }
  void TearDown() override {
    ep_comm().barrier("test tear-down");
    if (ep_comm().rank() == 0) std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace tiermoe::testing
