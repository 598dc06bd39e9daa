#pragma once
// Comm: the few collectives TierMoE runs between ranks, behind one small
// interface so the transport can change without touching the MoE layer or
// the trainer. LocalComm is the one-rank case (every collective is a local
// copy); MpiComm (dist/mpi_comm.h, its own library) runs them on Open MPI.
// A GPU cluster would put NCCL behind the same calls: alltoallv is a grouped
// ncclSend/ncclRecv, allgather and broadcast are NCCL's own.
//
// Determinism: nothing here reduces in an order the transport chooses.
// fold_sum() gathers every rank's buffer and adds them in rank order, so a
// sum over ranks has the same bits as the same partials added one after
// another on a single rank (MPI_Allreduce makes no such promise).
//
// Failure: every collective is bounded in time. A transport that cannot
// finish one (a rank died or hangs) throws CommError naming the operation,
// and the caller gives up (the CLI aborts the whole job).
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/error.h"
#include "tiermoe/core/tensor.h"

namespace tiermoe {

enum class CommOp : uint8_t { alltoallv, allgather, broadcast, barrier };
inline constexpr size_t kNumCommOps = 4;
std::string_view comm_op_name(CommOp op);  // "alltoallv", ...

// What the collectives of one kind did: calls, bytes to and from other
// ranks (a rank's block to itself is a local copy and not counted), and wall
// time inside the call (waiting for slower ranks included).
struct CommOpStats {
  int64_t calls = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  double seconds = 0;
  void add(const CommOpStats& o);
};

struct CommStats {
  std::array<CommOpStats, kNumCommOps> ops{};
  CommOpStats& operator[](CommOp op) { return ops[size_t(op)]; }
  const CommOpStats& operator[](CommOp op) const { return ops[size_t(op)]; }
  void add(const CommStats& o);
  // later - earlier, op by op (the stats of the calls in between)
  CommStats since(const CommStats& earlier) const;
};

// A collective that could not complete: a peer died, hangs, or is slower
// than the timeout allows.
class CommError : public Error {
 public:
  using Error::Error;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string name() const = 0;  // "local", "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Each rank sends send_bytes[r] bytes to rank r and receives recv_bytes[r]
  // from it. Blocks are contiguous in rank order in both buffers (block r
  // starts at the sum of the sizes before it). `what` names the call in
  // errors ("model.layers.3.mlp dispatch").
  void alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                 std::span<const size_t> recv_bytes, std::string_view what);
  // Every rank's `bytes` bytes, in rank order, into recv (size() * bytes).
  void allgather(const void* send, size_t bytes, void* recv, std::string_view what);
  // root's `bytes` bytes into every rank's `data`.
  void broadcast(void* data, size_t bytes, int root, std::string_view what);
  void barrier(std::string_view what);

  // acc = [acc +] x_0 + x_1 + ... + x_{P-1}, elementwise, left to right in
  // rank order, where x_r is rank r's `mine` (f32 or f64, same shape and
  // dtype as acc, contiguous). Without `accumulate` acc's old values are
  // ignored and the sum starts from x_0 itself. Every rank gets the same
  // bits, and they are the bits of adding the partials one by one on a
  // single rank. Runs in chunks, so it holds size() chunks at most.
  void fold_sum(Tensor& acc, const Tensor& mine, bool accumulate, std::string_view what);
  // Every rank's value, in rank order.
  std::vector<double> allgather_value(double mine, std::string_view what);
  std::vector<int64_t> allgather_value(int64_t mine, std::string_view what);
  // Every rank's bytes (any length), in rank order.
  std::vector<std::string> allgather_text(const std::string& mine, std::string_view what);

  const CommStats& stats() const { return stats_; }

 protected:
  virtual void do_alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                            std::span<const size_t> recv_bytes, std::string_view what) = 0;
  virtual void do_allgather(const void* send, size_t bytes, void* recv, std::string_view what) = 0;
  virtual void do_broadcast(void* data, size_t bytes, int root, std::string_view what) = 0;
  virtual void do_barrier(std::string_view what) = 0;

 private:
  CommStats stats_;
};

// One rank: every collective is a local copy.
class LocalComm final : public Comm {
 public:
  std::string name() const override { return "local"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }

 protected:
  void do_alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes, std::string_view what) override;
  void do_allgather(const void* send, size_t bytes, void* recv, std::string_view what) override;
  void do_broadcast(void* data, size_t bytes, int root, std::string_view what) override {}
  void do_barrier(std::string_view what) override {}
};

}  // namespace tiermoe
