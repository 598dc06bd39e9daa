#pragma once
// The ep tests run as P ranks under mpirun (CMake registers them with
// `mpirun -np 2`). Every rank runs every test; a test makes the same
// collectives on every rank, so checks that must not stop a test early are
// EXPECTs, and a check whose outcome all ranks must agree on goes through
// all_ranks().
#include <gtest/gtest.h>

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

}  // namespace tiermoe::testing
