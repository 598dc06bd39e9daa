#include "tiermoe/dist/comm.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "tiermoe/core/timer.h"

namespace tiermoe {

using detail::str_of;

std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::alltoallv:
      return "alltoallv";
    case CommOp::allgather:
      return "allgather";
    case CommOp::broadcast:
      return "broadcast";
    case CommOp::barrier:
      return "barrier";
  }
  __builtin_unreachable();
}

void CommOpStats::add(const CommOpStats& o) {
  calls += o.calls;
  bytes_sent += o.bytes_sent;
  bytes_received += o.bytes_received;
  seconds += o.seconds;
}

void CommStats::add(const CommStats& o) {
  for (size_t i = 0; i < kNumCommOps; ++i) ops[i].add(o.ops[i]);
}

CommStats CommStats::since(const CommStats& earlier) const {
  CommStats d;
  for (size_t i = 0; i < kNumCommOps; ++i) {
    d.ops[i].calls = ops[i].calls - earlier.ops[i].calls;
    d.ops[i].bytes_sent = ops[i].bytes_sent - earlier.ops[i].bytes_sent;
    d.ops[i].bytes_received = ops[i].bytes_received - earlier.ops[i].bytes_received;
    d.ops[i].seconds = ops[i].seconds - earlier.ops[i].seconds;
  }
  return d;
}

void Comm::alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                     std::span<const size_t> recv_bytes, std::string_view what) {
  const int P = size();
  TIERMOE_CHECK(int(send_bytes.size()) == P && int(recv_bytes.size()) == P,
                str_of("alltoallv with ", send_bytes.size(), " send and ", recv_bytes.size(),
                       " receive sizes over ", P, " ranks"),
                std::string(what), "pass one block size per rank");
  const auto t0 = Clock::now();
  do_alltoallv(send, send_bytes, recv, recv_bytes, what);
  CommOpStats& s = stats_[CommOp::alltoallv];
  ++s.calls;
  for (int r = 0; r < P; ++r) {
    if (r == rank()) continue;
    s.bytes_sent += send_bytes[size_t(r)];
    s.bytes_received += recv_bytes[size_t(r)];
  }
  s.seconds += seconds_since(t0);
}

void Comm::allgather(const void* send, size_t bytes, void* recv, std::string_view what) {
  const auto t0 = Clock::now();
  do_allgather(send, bytes, recv, what);
  CommOpStats& s = stats_[CommOp::allgather];
  ++s.calls;
  s.bytes_sent += bytes * size_t(size() - 1);
  s.bytes_received += bytes * size_t(size() - 1);
  s.seconds += seconds_since(t0);
}

void Comm::broadcast(void* data, size_t bytes, int root, std::string_view what) {
  TIERMOE_CHECK(root >= 0 && root < size(), str_of("broadcast from rank ", root, " of ", size()),
                std::string(what), "the root must be a rank of this job");
  const auto t0 = Clock::now();
  do_broadcast(data, bytes, root, what);
  CommOpStats& s = stats_[CommOp::broadcast];
  ++s.calls;
  if (rank() == root) {
    s.bytes_sent += bytes * size_t(size() - 1);
  } else {
    s.bytes_received += bytes;
  }
  s.seconds += seconds_since(t0);
}

void Comm::barrier(std::string_view what) {
  const auto t0 = Clock::now();
  do_barrier(what);
  ++stats_[CommOp::barrier].calls;
  stats_[CommOp::barrier].seconds += seconds_since(t0);
}

void Comm::fold_sum(Tensor& acc, const Tensor& mine, bool accumulate, std::string_view what) {
  TIERMOE_CHECK(
      acc.defined() && mine.defined() && acc.dtype() == mine.dtype() &&
          acc.numel() == mine.numel() && acc.dtype() != DType::bf16,
      "fold_sum needs two f32 or f64 buffers of one size, got " + acc.str() + " and " + mine.str(),
      std::string(what), "sum gradients in their f32 (f64) dtype");
  const int P = size();
  const int64_t n = acc.numel();
  const size_t es = dtype_size(acc.dtype());
  // Chunks of about 8 MiB over all ranks bound what the gather holds.
  const int64_t chunk = std::max<int64_t>(1, int64_t((size_t(8) << 20) / (es * size_t(P))));
  Tensor gathered = Tensor::empty({int64_t(P) * std::min(chunk, std::max<int64_t>(n, 1))},
                                  acc.dtype(), MemTag::activations);
  visit_dtype(acc.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bf16>) {
      T* a = acc.data<T>();
      const T* m = mine.data<T>();
      T* g = gathered.data<T>();
      for (int64_t begin = 0; begin < n; begin += chunk) {
        const int64_t len = std::min(chunk, n - begin);
        allgather(m + begin, size_t(len) * es, g, what);
        for (int64_t i = 0; i < len; ++i) {
          T s = accumulate ? T(a[begin + i] + g[i]) : g[i];
          for (int r = 1; r < P; ++r) s = T(s + g[int64_t(r) * len + i]);
          a[begin + i] = s;
        }
      }
    }
  });
}

std::vector<double> Comm::allgather_value(double mine, std::string_view what) {
  std::vector<double> all(static_cast<size_t>(size()));
  allgather(&mine, sizeof mine, all.data(), what);
  return all;
}

std::vector<int64_t> Comm::allgather_value(int64_t mine, std::string_view what) {
  std::vector<int64_t> all(static_cast<size_t>(size()));
  allgather(&mine, sizeof mine, all.data(), what);
  return all;
}

std::vector<std::string> Comm::allgather_text(const std::string& mine, std::string_view what) {
  const std::vector<int64_t> sizes = allgather_value(int64_t(mine.size()), what);
  const size_t longest = size_t(*std::max_element(sizes.begin(), sizes.end()));
  std::string padded = mine;
  padded.resize(longest);
  std::string all(longest * size_t(size()), '\0');
  allgather(padded.data(), longest, all.data(), what);
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r)
    out.push_back(all.substr(size_t(r) * longest, size_t(sizes[size_t(r)])));
  return out;
}

void LocalComm::do_alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                             std::span<const size_t> recv_bytes, std::string_view what) {
  TIERMOE_CHECK(
      send_bytes[0] == recv_bytes[0],
      str_of("one rank sends itself ", send_bytes[0], " bytes but expects ", recv_bytes[0]),
      std::string(what), "the send and receive sizes of a rank's own block must agree");
  if (send_bytes[0] > 0 && send != recv) std::memmove(recv, send, send_bytes[0]);
}

void LocalComm::do_allgather(const void* send, size_t bytes, void* recv, std::string_view what) {
  if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
}

}  // namespace tiermoe
