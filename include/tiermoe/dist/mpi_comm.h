#pragma once
// MpiComm: Comm on Open MPI, over MPI_COMM_WORLD (one rank per process,
// started by mpirun). Only the CLI and the `ep` tests link it; the library
// modules see the Comm interface alone, and this header does not include
// mpi.h.
//
// Every collective is the nonblocking MPI call polled with MPI_Test until it
// completes or `timeout_s` passes; then it throws CommError ("alltoallv of
// model.layers.1.mlp dispatch did not complete within 30 s: ...").
// A rank that dies is usually seen sooner: mpirun ends the whole job when a
// process exits abnormally. After a CommError the job cannot continue (a
// collective is half done): the caller reports it and calls abort().
#include <memory>
#include <string>

#include "tiermoe/dist/comm.h"

namespace tiermoe {

// True when this process was started by mpirun (Open MPI's or a PMI
// launcher's environment variables are set).
bool launched_by_mpirun();

class MpiComm final : public Comm {
 public:
  // Initialises MPI (MPI_THREAD_FUNNELED: only the thread that made the
  // MpiComm calls MPI). One per process; MPI cannot be initialised twice.
  explicit MpiComm(double timeout_s);
  ~MpiComm() override;  // MPI_Finalize (MPI_Abort after a timed-out collective)
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // The number of ranks on this host (to share its cores between them).
  int local_size() const { return local_size_; }
  double timeout_s() const { return timeout_s_; }
  void set_timeout(double seconds);

  // Ends every rank of the job with `code` (MPI_Abort); for the CLI after an
  // error on one rank, so that no other rank waits for it.
  [[noreturn]] void abort(int code);

 protected:
  void do_alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes, std::string_view what) override;
  void do_allgather(const void* send, size_t bytes, void* recv, std::string_view what) override;
  void do_broadcast(void* data, size_t bytes, int root, std::string_view what) override;
  void do_barrier(std::string_view what) override;

 private:
  struct Request;
  // Polls the request until it completes; throws CommError past the timeout.
  void wait(Request& request, CommOp op, std::string_view what);

  int rank_ = 0, size_ = 1, local_size_ = 1;
  double timeout_s_;
  bool broken_ = false;  // a collective timed out and is still pending
};

}  // namespace tiermoe
