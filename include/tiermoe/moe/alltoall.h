#pragma once
// AllToAllDispatcher: expert parallelism over a Comm (dist/comm.h). The E
// experts are split evenly over the W ranks; each rank plans its own tokens
// (expert-major, as a local dispatcher would), then
//   exchange():     the per-expert row counts of rank r's experts go to r
//                   (an all-to-all of El counts per pair of ranks);
//   to_experts():   the rows themselves (x, and the router scores when they
//                   are absorbed; dy in backward) go to their experts' owners;
//   from_experts(): the owners' results (y; dx and d score in backward) come
//                   back to the rows' source, in plan order.
// The combine then runs on the source rank, adding each token's K
// contributions in slot order, so the sum is the one a single rank makes.
// See ExpertExchange (dispatch.h) for the layout of the received rows.
#include <memory>
#include <string>

#include "tiermoe/dist/comm.h"
#include "tiermoe/moe/dispatch.h"

namespace tiermoe {

class AllToAllDispatcher final : public Dispatcher {
 public:
  // `comm` (and `inner`, which makes each rank's local plan; default a
  // LocalDispatcher) must outlive the dispatcher.
  explicit AllToAllDispatcher(Comm& comm, const Dispatcher* inner = nullptr);

  std::string name() const override;
  // The inner dispatcher's plan; E must be a multiple of the rank count.
  DispatchPlan plan(const std::vector<int32_t>& ids_TK, const Tensor& weights_TK,
                    int64_t num_experts) const override;
  int ranks() const override { return comm_->size(); }
  int rank() const override { return comm_->rank(); }
  ExpertExchange exchange(const DispatchPlan& plan, std::string_view what) const override;
  Tensor to_experts(const Tensor& rows, const ExpertExchange& ex, MemoryTracker& mem,
                    std::string_view what) const override;
  Tensor from_experts(const Tensor& rows, const ExpertExchange& ex, MemoryTracker& mem,
                      std::string_view what) const override;

  Comm& comm() const { return *comm_; }

 private:
  Comm* comm_;
  LocalDispatcher local_;
  const Dispatcher* inner_;
};

}  // namespace tiermoe
