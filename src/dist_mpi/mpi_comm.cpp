#include "tiermoe/dist/mpi_comm.h"

#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tiermoe/core/timer.h"

namespace tiermoe {

using detail::str_of;

namespace {

void check_mpi(int rc, const char* call, std::string_view what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(str_of(call, " failed: ", std::string(text, size_t(len))), std::string(what),
                  "an MPI error: check that every rank runs the same command");
}

int as_count(size_t bytes, std::string_view what) {
  TIERMOE_CHECK(bytes <= size_t(INT_MAX),
                str_of("a block of ", bytes, " bytes is over MPI's 2 GiB message limit"),
                std::string(what), "use fewer tokens per micro-batch (--batch, --seq-len)");
  return int(bytes);
}

}  // namespace

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

struct MpiComm::Request {
  MPI_Request handle = MPI_REQUEST_NULL;
};

MpiComm::MpiComm(double timeout_s) : timeout_s_(timeout_s) {
  set_timeout(timeout_s);
  int initialized = 0;
  MPI_Initialized(&initialized);
  TIERMOE_CHECK(!initialized, "MPI is initialised already", "MpiComm",
                "make one MpiComm per process");
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread",
            "MpiComm");
  // Errors come back as codes (and become CommErrors) instead of aborting.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type", "MpiComm");
  MPI_Comm_size(node, &local_size_);
  MPI_Comm_free(&node);
}

MpiComm::~MpiComm() {
  // A collective left half done would make MPI_Finalize wait for it forever.
  if (broken_) abort(1);
  MPI_Finalize();
}

void MpiComm::set_timeout(double seconds) {
  TIERMOE_CHECK(seconds > 0, str_of("collective timeout ", seconds, " s"), "--comm-timeout",
                "give a positive number of seconds");
  timeout_s_ = seconds;
}

void MpiComm::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; in case it does
}

void MpiComm::wait(Request& request, CommOp op, std::string_view what) {
  const auto start = Clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request.handle, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
    if (done) return;
    if (seconds_since(start) > timeout_s_) {
      broken_ = true;
      throw CommError(str_of(comm_op_name(op), " of ", what, " did not complete within ",
                             timeout_s_, " s: another rank died, hangs, or is that much slower"),
                      "MPI",
                      "check the other ranks' output; raise --comm-timeout if a rank "
                      "legitimately needs longer between collectives");
    }
    // Spin briefly (most collectives finish within microseconds of the last
    // rank arriving), then poll gently so a waiting rank leaves the cores to
    // the others.
    if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void MpiComm::do_alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                           std::span<const size_t> recv_bytes, std::string_view what) {
  const size_t P = static_cast<size_t>(size_);
  std::vector<int> sc(P), sd(P), rc(P), rd(P);
  size_t so = 0, ro = 0;
  for (size_t r = 0; r < P; ++r) {
    sc[r] = as_count(send_bytes[r], what);
    sd[r] = as_count(so, what);
    rc[r] = as_count(recv_bytes[r], what);
    rd[r] = as_count(ro, what);
    so += send_bytes[r];
    ro += recv_bytes[r];
  }
  Request req;
  check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                           MPI_BYTE, MPI_COMM_WORLD, &req.handle),
            "MPI_Ialltoallv", what);
  wait(req, CommOp::alltoallv, what);
}

void MpiComm::do_allgather(const void* send, size_t bytes, void* recv, std::string_view what) {
  const int n = as_count(bytes, what);
  as_count(bytes * size_t(size_), what);  // displacements are ints too
  Request req;
  check_mpi(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, MPI_COMM_WORLD, &req.handle),
            "MPI_Iallgather", what);
  wait(req, CommOp::allgather, what);
}

void MpiComm::do_broadcast(void* data, size_t bytes, int root, std::string_view what) {
  Request req;
  check_mpi(MPI_Ibcast(data, as_count(bytes, what), MPI_BYTE, root, MPI_COMM_WORLD, &req.handle),
            "MPI_Ibcast", what);
  wait(req, CommOp::broadcast, what);
}

void MpiComm::do_barrier(std::string_view what) {
  Request req;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &req.handle), "MPI_Ibarrier", what);
  wait(req, CommOp::barrier, what);
}

}  // namespace tiermoe
