#include "tiermoe/moe/alltoall.h"

namespace tiermoe {

using detail::str_of;

namespace {

// Bytes of one row of `rows` (its trailing dimensions), whatever its row count.
size_t row_bytes(const Tensor& rows) {
  size_t b = dtype_size(rows.dtype());
  for (int64_t i = 1; i < rows.dim(); ++i) b *= size_t(rows.size(i));
  return b;
}

Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

}  // namespace

AllToAllDispatcher::AllToAllDispatcher(Comm& comm, const Dispatcher* inner)
    : comm_(&comm), inner_(inner ? inner : &local_) {}

std::string AllToAllDispatcher::name() const {
  return str_of("alltoall(", comm_->size(), " ranks over ", comm_->name(), ", ", inner_->name(),
                ")");
}

DispatchPlan AllToAllDispatcher::plan(const std::vector<int32_t>& ids_TK, const Tensor& weights_TK,
                                      int64_t num_experts) const {
  TIERMOE_CHECK(num_experts % comm_->size() == 0,
                str_of(num_experts, " experts do not split evenly over ", comm_->size(), " ranks"),
                name(), "run a number of ranks that divides the expert count");
  return inner_->plan(ids_TK, weights_TK, num_experts);
}

ExpertExchange AllToAllDispatcher::exchange(const DispatchPlan& plan, std::string_view what) const {
  const int P = comm_->size();
  const int64_t El = plan.E / P;
  TIERMOE_ASSERT(El * P == plan.E, "a plan of ", plan.E, " experts over ", P, " ranks");
  ExpertExchange ex;
  ex.ranks = P;
  ex.rank = comm_->rank();
  ex.local_experts = El;
  ex.send_rows_W.resize(size_t(P));
  for (int r = 0; r < P; ++r) {
    ex.send_rows_W[size_t(r)] = plan.offset_E[size_t((r + 1) * El)] - plan.offset_E[size_t(r * El)];
  }
  // Rank r's experts' counts are the r-th run of El entries of count_E.
  ex.recv_count_WEl.assign(size_t(P * El), 0);
  const std::vector<size_t> block(static_cast<size_t>(P), size_t(El) * sizeof(int64_t));
  comm_->alltoallv(plan.count_E.data(), block, ex.recv_count_WEl.data(), block,
                   str_of(what, " expert counts"));
  ex.segment_W.assign(size_t(P) + 1, 0);
  for (int s = 0; s < P; ++s) {
    int64_t rows = 0;
    for (int64_t e = 0; e < El; ++e) {
      const int64_t c = ex.recv_count_WEl[size_t(s * El + e)];
      TIERMOE_CHECK(c >= 0, str_of("rank ", s, " sends ", c, " rows for local expert ", e),
                    std::string(what), "the ranks disagree about the exchange; a corrupt message?");
      rows += c;
    }
    ex.segment_W[size_t(s) + 1] = ex.segment_W[size_t(s)] + rows;
  }
  return ex;
}

Tensor AllToAllDispatcher::to_experts(const Tensor& rows, const ExpertExchange& ex,
                                      MemoryTracker& mem, std::string_view what) const {
  const int P = ex.ranks;
  if (P == 1) return rows;
  const int64_t N = rows.size(0);
  int64_t sent = 0;
  for (int64_t r : ex.send_rows_W) sent += r;
  TIERMOE_CHECK(sent == N, str_of(what, ": ", N, " rows to send, the exchange plans ", sent),
                name(), "pass the rows of the plan the exchange was made from");
  const size_t rb = row_bytes(rows);
  std::vector<size_t> send(static_cast<size_t>(P)), recv(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    send[size_t(r)] = size_t(ex.send_rows_W[size_t(r)]) * rb;
    recv[size_t(r)] = size_t(ex.segment_W[size_t(r) + 1] - ex.segment_W[size_t(r)]) * rb;
  }
  Tensor out =
      Tensor::empty(with_rows(rows, ex.received_rows()), rows.dtype(), MemTag::activations, mem);
  comm_->alltoallv(rows.raw(), send, out.raw(), recv, what);
  return out;
}

Tensor AllToAllDispatcher::from_experts(const Tensor& rows, const ExpertExchange& ex,
                                        MemoryTracker& mem, std::string_view what) const {
  const int P = ex.ranks;
  if (P == 1) return rows;
  TIERMOE_CHECK(
      rows.size(0) == ex.received_rows(),
      str_of(what, ": ", rows.size(0), " rows to return, ", ex.received_rows(), " were received"),
      name(), "pass the owner-side rows of this exchange");
  const size_t rb = row_bytes(rows);
  int64_t N = 0;
  std::vector<size_t> send(static_cast<size_t>(P)), recv(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    send[size_t(r)] = size_t(ex.segment_W[size_t(r) + 1] - ex.segment_W[size_t(r)]) * rb;
    recv[size_t(r)] = size_t(ex.send_rows_W[size_t(r)]) * rb;
    N += ex.send_rows_W[size_t(r)];
  }
  Tensor out = Tensor::empty(with_rows(rows, N), rows.dtype(), MemTag::activations, mem);
  comm_->alltoallv(rows.raw(), send, out.raw(), recv, what);
  return out;
}

}  // namespace tiermoe
