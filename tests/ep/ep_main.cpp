// The ep tests' main: MPI first (one MpiComm for the whole job), then every
// test on every rank. A rank's failure fails mpirun's exit status.
#include <gtest/gtest.h>

#include <memory>

#include "ep/ep_env.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/dist/mpi_comm.h"

namespace tiermoe::testing {
namespace {
MpiComm* the_comm = nullptr;
}
Comm& ep_comm() { return *the_comm; }
}  // namespace tiermoe::testing

int main(int argc, char** argv) {
  // A missed collective should fail a test within a minute, not hang it.
  tiermoe::MpiComm comm(/*timeout_s=*/60);
  tiermoe::testing::the_comm = &comm;
  // One thread per rank: the ranks share this machine's cores, and results
  // compared bitwise must run the same kernels on the same thread counts.
  tiermoe::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  // Every rank reports; the job fails if any rank's tests failed.
  const bool ok = tiermoe::testing::all_ranks(failed == 0);
  return ok ? 0 : 1;
}
