#include "tiermoe/moe/dispatch.h"

#include <algorithm>

namespace tiermoe {

namespace {

// Counting sort of the T*K (token, slot) pairs by expert. Visiting the pairs in
// flat order t*K + k keeps the sort stable, so rows inside an expert come in
// (token, slot) order. Each expert e then gets padded_E[e] >= count rows.
template <class PadFn>
DispatchPlan build_plan(const std::vector<int32_t>& ids_TK, const Tensor& weights_TK,
                        int64_t E, std::string_view who, PadFn&& padded_count) {
  TIERMOE_CHECK(weights_TK.defined() && weights_TK.dim() == 2,
                "weights_TK must be [T, K], got " + weights_TK.str(), std::string(who),
                "pass the routing's weights_TK");
  TIERMOE_CHECK(weights_TK.dtype() != DType::bf16,
                "weights_TK must be in the score dtype (f32 or f64), got " + weights_TK.str(),
                std::string(who), "router scores are fp32 (f64 in f64 runs)");
  const int64_t T = weights_TK.size(0), K = weights_TK.size(1);
  TIERMOE_CHECK(int64_t(ids_TK.size()) == T * K,
                detail::str_of("ids_TK has ", ids_TK.size(), " entries, weights_TK is ",
                               weights_TK.str()),
                std::string(who), "ids_TK and weights_TK come from the same routing");
  TIERMOE_CHECK(E >= 1 && K <= E, detail::str_of("top_k ", K, " with ", E, " experts"),
                std::string(who), "top_k must be at most the number of experts");

  DispatchPlan p;
  p.T = T, p.K = K, p.E = E;
  std::vector<int64_t> routed_E(size_t(E), 0);
  for (int64_t i = 0; i < T * K; ++i) {
    int32_t e = ids_TK[size_t(i)];
    TIERMOE_CHECK(e >= 0 && e < E,
                  detail::str_of("expert id ", e, " at token ", i / K, " slot ", i % K,
                                 " is outside [0, ", E, ")"),
                  std::string(who), "check the router's num_experts");
    ++routed_E[size_t(e)];
  }
  p.count_E.resize(size_t(E));
  p.offset_E.assign(size_t(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    p.count_E[size_t(e)] = padded_count(routed_E[size_t(e)]);
    p.offset_E[size_t(e) + 1] = p.offset_E[size_t(e)] + p.count_E[size_t(e)];
  }
  p.N = p.offset_E[size_t(E)];
  p.token_N.assign(size_t(p.N), -1);
  p.slot_N.assign(size_t(p.N), -1);
  p.row_TK.resize(size_t(T * K));
  std::vector<int64_t> next(p.offset_E.begin(), p.offset_E.end() - 1);
  for (int64_t i = 0; i < T * K; ++i) {
    int64_t n = next[size_t(ids_TK[size_t(i)])]++;
    p.token_N[size_t(n)] = int32_t(i / K);
    p.slot_N[size_t(n)] = int32_t(i % K);
    p.row_TK[size_t(i)] = n;
  }
  p.score_N = Tensor::zeros({p.N}, weights_TK.dtype());
  visit_dtype(weights_TK.dtype(), [&]<class S>() {
    if constexpr (!std::is_same_v<S, bf16>) {
      const S* w = weights_TK.data<S>();
      S* s = p.score_N.data<S>();
      for (int64_t i = 0; i < T * K; ++i) s[p.row_TK[size_t(i)]] = w[i];
    }
  });
  return p;
}

}  // namespace

std::vector<int64_t> ExpertExchange::segment_offsets(int s) const {
  std::vector<int64_t> off(size_t(local_experts) + 1, 0);
  for (int64_t e = 0; e < local_experts; ++e) {
    off[size_t(e) + 1] = off[size_t(e)] + recv_count_WEl[size_t(s * local_experts + e)];
  }
  return off;
}

ExpertExchange Dispatcher::exchange(const DispatchPlan& plan, std::string_view what) const {
  ExpertExchange ex;
  ex.local_experts = plan.E;
  ex.send_rows_W = {plan.N};
  ex.recv_count_WEl = plan.count_E;
  ex.segment_W = {0, plan.N};
  return ex;
}

Tensor Dispatcher::to_experts(const Tensor& rows, const ExpertExchange& ex, MemoryTracker& mem,
                              std::string_view what) const {
  return rows;
}

Tensor Dispatcher::from_experts(const Tensor& rows, const ExpertExchange& ex, MemoryTracker& mem,
                                std::string_view what) const {
  return rows;
}

DispatchPlan LocalDispatcher::plan(const std::vector<int32_t>& ids_TK, const Tensor& weights_TK,
                                   int64_t num_experts) const {
  return build_plan(ids_TK, weights_TK, num_experts, "LocalDispatcher",
                    [](int64_t rows) { return rows; });
}

PaddedDispatcher PaddedDispatcher::to_multiple(int64_t multiple) {
  TIERMOE_CHECK(multiple >= 1, detail::str_of("padding multiple ", multiple),
                "PaddedDispatcher", "pad to a multiple of at least 1");
  return PaddedDispatcher(multiple, {});
}

PaddedDispatcher PaddedDispatcher::to_ladder(std::vector<int64_t> buckets) {
  TIERMOE_CHECK(!buckets.empty() && buckets.front() >= 1 &&
                    std::is_sorted(buckets.begin(), buckets.end()) &&
                    std::adjacent_find(buckets.begin(), buckets.end()) == buckets.end(),
                "bucket ladder must be non-empty, positive and strictly ascending",
                "PaddedDispatcher", "e.g. {16, 32, 64, 128, 256}");
  return PaddedDispatcher(0, std::move(buckets));
}

std::string PaddedDispatcher::name() const {
  if (buckets_.empty()) return "padded(multiple " + std::to_string(multiple_) + ")";
  std::string s = "padded(ladder";
  for (int64_t b : buckets_) {
    s += ' ';
    s += std::to_string(b);
  }
  return s + ")";
}

int64_t PaddedDispatcher::padded_count(int64_t rows) const {
  if (rows == 0) return 0;
  if (buckets_.empty()) return (rows + multiple_ - 1) / multiple_ * multiple_;
  for (int64_t b : buckets_) {
    if (rows <= b) return b;
  }
  int64_t top = buckets_.back();
  return (rows + top - 1) / top * top;
}

DispatchPlan PaddedDispatcher::plan(const std::vector<int32_t>& ids_TK, const Tensor& weights_TK,
                                    int64_t num_experts) const {
  return build_plan(ids_TK, weights_TK, num_experts, name(),
                    [this](int64_t rows) { return padded_count(rows); });
}

}  // namespace tiermoe
