#pragma once
// Dispatch: which routed row goes where. A dispatcher turns a routing (ids_TK,
// weights_TK) into a DispatchPlan with expert-major rows; permute/unpermute are
// pure functions of the plan. Dispatchers have no parameters and no state.
//
// Determinism: combine adds a token's K contributions in slot order k = 0..K-1,
// whatever order the rows were grouped or computed in, so outputs and gradients
// are bitwise independent of the dispatcher (as long as each row's expert
// result does not depend on how many rows its expert had).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

struct DispatchPlan {
  int64_t T = 0, K = 0, E = 0;
  int64_t N = 0;                 // rows, padding included (N >= T*K)
  std::vector<int64_t> count_E;  // rows of expert e, padding included
  std::vector<int64_t> offset_E; // first row of expert e; E+1 entries, offset_E[E] == N
  std::vector<int32_t> token_N;  // token of row n, -1 for a padded row
  std::vector<int32_t> slot_N;   // slot k of row n, -1 for a padded row
  std::vector<int64_t> row_TK;   // row of (t, k): the inverse of (token_N, slot_N)
  // weights_TK gathered to rows, score dtype (fp32; f64 in f64 runs); padded
  // rows carry 0. Absorbed runs scale W2's input by it; post-combine runs
  // scale the expert outputs by it in combine (equal to weights_TK[t, k]).
  Tensor score_N;

  int64_t routed_rows() const { return T * K; }
  int64_t padded_rows() const { return N - T * K; }
};

// Where a plan's rows are computed. With expert parallelism the E experts
// are split evenly over W ranks (rank r owns experts [r*El, (r+1)*El), El =
// E/W). A rank sends the rows of rank r's experts (contiguous in its
// expert-major plan) to r, and receives from every source rank s the rows
// of its own experts: S rows in all, source-major, one segment per source,
// each expert-major over the local experts. The owner computes each segment
// on its own (the same rows, in the same order, as source s's micro-batch
// would give one rank), so results do not depend on W.
// Without expert parallelism there is one segment: the plan's rows.
struct ExpertExchange {
  int ranks = 1, rank = 0;              // W, and this rank
  int64_t local_experts = 0;            // El
  std::vector<int64_t> send_rows_W;     // plan rows sent to rank r
  std::vector<int64_t> recv_count_WEl;  // rows of local expert e from source s, at s * El + e
  std::vector<int64_t> segment_W;       // first received row of source s; W+1 entries

  int64_t received_rows() const { return segment_W.back(); }  // S
  // Source s's local offsets: El+1 entries from 0 to the segment's rows.
  std::vector<int64_t> segment_offsets(int s) const;
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  virtual std::string name() const = 0;
  // ids_TK: T*K expert ids in [0, E), slot order per token; weights_TK: [T, K],
  // score dtype. Throws an Error on an id out of range or a shape mismatch.
  virtual DispatchPlan plan(const std::vector<int32_t>& ids_TK, const Tensor& weights_TK,
                            int64_t num_experts) const = 0;

  // Expert parallelism: how many ranks share the experts, and which is this.
  virtual int ranks() const { return 1; }
  virtual int rank() const { return 0; }
  // The exchange layout of a plan (expert-parallel dispatchers exchange the
  // per-expert counts: a collective). `what` names the layer in errors.
  virtual ExpertExchange exchange(const DispatchPlan& plan, std::string_view what) const;
  // Rows (first dimension) to the experts' owners: plan rows (N) ->
  // received rows (S); and back: S -> N. Collectives when W > 1;
  // without expert parallelism both return `rows` itself.
  virtual Tensor to_experts(const Tensor& rows, const ExpertExchange& ex, MemoryTracker& mem,
                            std::string_view what) const;
  virtual Tensor from_experts(const Tensor& rows, const ExpertExchange& ex, MemoryTracker& mem,
                              std::string_view what) const;
};

// Rows sorted by expert, stably: within an expert rows are in (token, slot) order.
class LocalDispatcher final : public Dispatcher {
 public:
  std::string name() const override { return "local"; }
  DispatchPlan plan(const std::vector<int32_t>& ids_TK, const Tensor& weights_TK,
                    int64_t num_experts) const override;
};

// Like LocalDispatcher, then each non-empty expert's rows are padded with
// zero rows (score 0, token -1) up to a fixed shape: the smallest bucket of a
// ladder that holds them (past the largest bucket, a multiple of it), or a
// multiple of `multiple`. Fixed shapes let a device reuse compiled graphs.
class PaddedDispatcher final : public Dispatcher {
 public:
  static PaddedDispatcher to_multiple(int64_t multiple);
  static PaddedDispatcher to_ladder(std::vector<int64_t> buckets);  // ascending, > 0

  std::string name() const override;
  int64_t padded_count(int64_t rows) const;  // 0 stays 0
  DispatchPlan plan(const std::vector<int32_t>& ids_TK, const Tensor& weights_TK,
                    int64_t num_experts) const override;

 private:
  PaddedDispatcher(int64_t multiple, std::vector<int64_t> buckets)
      : multiple_(multiple), buckets_(std::move(buckets)) {}
  int64_t multiple_;
  std::vector<int64_t> buckets_;
};

// x_ND[n] = x_TD[token_N[n]]; padded rows are zero.
void permute_forward(Tensor& x_ND, const Tensor& x_TD, const DispatchPlan& plan);
// dx_TD[t] (+)= sum over k = 0..K-1 of dx_ND[row_TK(t, k)], summed in acc_t.
void permute_backward(Tensor& dx_TD, const Tensor& dx_ND, const DispatchPlan& plan,
                      bool accumulate = false);

// The combine (unpermute). absorbed: out_TD[t] = sum_k y_ND[row(t, k)];
// otherwise out_TD[t] = sum_k score_N[row(t, k)] * y_ND[row(t, k)]
// (= weights_TK[t, k] * y). Slot order, acc_t accumulation, one rounding.
void combine_forward(Tensor& out_TD, const Tensor& y_ND, const DispatchPlan& plan, bool absorbed);
// dy_ND[n] = dout_TD[t_n] (absorbed) or score_N[n] * dout_TD[t_n]; padded rows 0.
// Post-combine also gives dscore_N[n] = <dout_TD[t_n], y_ND[n]> (score dtype;
// pass undefined tensors for dscore_N and y_ND when absorbed).
void combine_backward(Tensor& dy_ND, Tensor& dscore_N, const Tensor& dout_TD, const Tensor& y_ND,
                      const DispatchPlan& plan, bool absorbed);

// score_N is a gather of weights_TK; its backward scatters:
// dweights_TK[t, k] (+)= dscore_N[row(t, k)].
void scores_backward(Tensor& dweights_TK, const Tensor& dscore_N, const DispatchPlan& plan,
                     bool accumulate = false);

}  // namespace tiermoe
