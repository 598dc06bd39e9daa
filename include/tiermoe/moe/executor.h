#pragma once
// ExpertExecutor: the seam between a MoE layer and where its experts run. The
// layer hands over dispatched rows in expert-major order (rows
// [offset_E[e], offset_E[e+1]) belong to expert e) with one router score per
// row; the executor returns one output row per input row. HostExperts runs
// GroupedExperts on the host CPU kernels; the tier module's TieredExperts
// implements the same interface across host and device, so nothing here
// assumes where a row is computed, only that each row's result is the same
// wherever it is.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/moe/experts.h"
#include "tiermoe/moe/saved.h"

namespace tiermoe {

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  virtual std::string name() const = 0;
  virtual int64_t num_experts() const = 0;
  virtual int64_t hidden() const = 0;
  virtual DType dtype() const = 0;
  // True when an output postprocess (e.g. RMSNorm) owns the expert outputs:
  // router scores must then be applied after it, in combine.
  virtual bool has_output_postprocess() const = 0;

  // y_ND = experts(x_ND) over the row ranges of offset_E (E+1 entries). With
  // score_N defined (score dtype, one per row, 0 on padded rows) the score is
  // absorbed before W2. What backward needs goes into `saved` (MemTag::saved);
  // the expert inputs x_ND only when weight_grads (dx alone does not need them).
  virtual void forward(Tensor& y_ND, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                       const Tensor& score_N, SavedTensors& saved, bool weight_grads) = 0;
  // Writes dx_ND, and dscore_N (score dtype) when score_N is defined. With
  // weight_grads the experts' parameter grads accumulate (+=).
  virtual void backward(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                        const std::vector<int64_t>& offset_E, const Tensor& score_N,
                        const SavedTensors& saved, bool weight_grads) = 0;
};

// Runs a GroupedExperts on the host, one GEMM per expert per step. Experts
// run in parallel (largest first, one thread each) when more than one has
// rows; a lone expert gets the whole pool inside its GEMMs.
class HostExperts final : public ExpertExecutor {
 public:
  explicit HostExperts(GroupedExperts& experts) : experts_(&experts) {}

  std::string name() const override { return "host:" + experts_->name(); }
  int64_t num_experts() const override { return experts_->config().num_experts; }
  int64_t hidden() const override { return experts_->config().hidden; }
  DType dtype() const override { return experts_->dtype(); }
  bool has_output_postprocess() const override { return experts_->has_output_postprocess(); }
  GroupedExperts& experts() { return *experts_; }

  void forward(Tensor& y_ND, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
               const Tensor& score_N, SavedTensors& saved, bool weight_grads) override;
  void backward(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                const std::vector<int64_t>& offset_E, const Tensor& score_N,
                const SavedTensors& saved, bool weight_grads) override;

 private:
  GroupedExperts* experts_;
};

// Calls fn(e) for every expert with rows, in parallel across experts when
// more than one has rows (largest first). Exceptions propagate to the caller.
void for_each_expert(const std::vector<int64_t>& offset_E, const std::function<void(int64_t)>& fn);

}  // namespace tiermoe
