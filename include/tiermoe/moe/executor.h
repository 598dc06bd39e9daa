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

// Which of the expert activations a forward keeps for backward (the rest are
// dropped when forward returns and, if backward needs them, rebuilt by
// replay()). moe/regions.h decides them from the remat regions: x_ND is the
// dispatch region's output, h_N2F w13's, a_NF act's, ypre_ND/rstd_N w2's.
struct ExpertSaves {
  bool x = true;  // x_ND, the input rows (dW13, or the input of a w13 replay)
  bool h = true;  // h_N2F, W13 output (activation backward)
  bool a = true;  // a_NF, activation output, unscaled (dW2, absorbed d score)
  bool w2 = true; // ypre_ND and rstd_N (post_norm only: the postprocess backward)
  // The adapter's intermediates (experts with a LoRA adapter only): W13's
  // lora_gate_NR and lora_up_NR, W2's lora_down_NR.
  bool lora_w13 = true, lora_w2 = true;
};

// Which of the experts' stages carry a LoRA adapter (ExpertAdapter) whose
// backward needs saves: w13 (gate_proj / up_proj), w2 (down_proj).
struct ExpertAdapted {
  bool w13 = false, w2 = false;
  bool any() const { return w13 || w2; }
};

// Which forward stages a replay re-runs, in order: W13 (x_ND -> h_N2F),
// the activation (h_N2F -> a_NF), W2 (a_NF -> ypre_ND, rstd_N; post_norm only,
// since nothing else in backward reads a W2 product).
struct ExpertStages {
  bool w13 = false, act = false, w2 = false;
  bool any() const { return w13 || act || w2; }
};

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
  // The stages a LoRA adapter sits on (none by default).
  virtual ExpertAdapted adapted() const { return {}; }

  // y_ND = experts(x_ND) over the row ranges of offset_E (E+1 entries). With
  // score_N defined (score dtype, one per row, 0 on padded rows) the score is
  // absorbed before W2. The activations named in `keep` go into `saved`
  // (MemTag::saved) as "x_ND", "h_N2F", "a_NF" [, "ypre_ND", "rstd_N"] [, the
  // adapter's "lora_gate_NR", "lora_up_NR", "lora_down_NR"]; the others live
  // only while forward runs.
  virtual void forward(Tensor& y_ND, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                       const Tensor& score_N, SavedTensors& saved, const ExpertSaves& keep) = 0;
  // Re-runs the forward `stages` over the same rows and adds what they rebuild
  // to `saved`, bitwise equal to the first forward (same kernels, same rows
  // per expert, same threads). Inputs come from `saved` (h_N2F for the
  // activation, a_NF for W2) or x_ND (for W13; undefined when not re-run).
  virtual void replay(SavedTensors& saved, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                      const Tensor& score_N, const ExpertStages& stages) = 0;
  // Writes dx_ND, and dscore_N (score dtype) when score_N is defined. With
  // weight_grads the experts' parameter grads accumulate (+=); with
  // adapter_grads an adapter's backward runs (its grads accumulate, its input
  // gradient joins dx). `saved` must hold h_N2F, a_NF when weight_grads,
  // score_N or a down adapter, x_ND when weight_grads or a gate/up adapter,
  // ypre_ND/rstd_N with a postprocess, and the adapter's intermediates.
  virtual void backward(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                        const std::vector<int64_t>& offset_E, const Tensor& score_N,
                        const SavedTensors& saved, bool weight_grads, bool adapter_grads) = 0;
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
  ExpertAdapted adapted() const override;
  GroupedExperts& experts() { return *experts_; }

  void forward(Tensor& y_ND, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
               const Tensor& score_N, SavedTensors& saved, const ExpertSaves& keep) override;
  void replay(SavedTensors& saved, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
              const Tensor& score_N, const ExpertStages& stages) override;
  void backward(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                const std::vector<int64_t>& offset_E, const Tensor& score_N,
                const SavedTensors& saved, bool weight_grads, bool adapter_grads) override;

  // The pieces of the three calls above, for an executor that runs some
  // experts here and the others elsewhere (tier/TieredExperts). `skip_E`
  // (one flag per expert, or empty for none) names experts left alone.
  //
  // forward: argument checks, then the N-row activation buffers (the kept
  // ones in `saved`, the others scratch), then the experts' rows into them.
  void check_forward(const Tensor& y_ND, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                     const Tensor& score_N) const;
  ExpertRowsActs forward_buffers(SavedTensors& saved, const Tensor& x_ND, const ExpertSaves& keep);
  void forward_experts(Tensor& y_ND, ExpertRowsActs& all, const Tensor& x_ND,
                       const std::vector<int64_t>& offset_E, const Tensor& score_N,
                       const std::vector<uint8_t>& skip_E);
  // replay: the buffers of the re-run stages (added to `saved`), then the rows.
  void replay_buffers(SavedTensors& saved, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                      const ExpertStages& stages);
  void replay_experts(SavedTensors& saved, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                      const Tensor& score_N, const ExpertStages& stages,
                      const std::vector<uint8_t>& skip_E);
  void check_backward(const Tensor& dx_ND, const Tensor& dscore_N, const Tensor& dy_ND,
                      const std::vector<int64_t>& offset_E, const Tensor& score_N) const;
  void backward_experts(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                        const std::vector<int64_t>& offset_E, const Tensor& score_N,
                        const SavedTensors& saved, bool weight_grads, bool adapter_grads,
                        const std::vector<uint8_t>& skip_E);

 private:
  GroupedExperts* experts_;
};

// Calls fn(e) for every expert with rows (and skip_E[e] unset, when skip_E
// is not empty), in parallel across experts when more than one has rows
// (largest first). Exceptions propagate to the caller.
void for_each_expert(const std::vector<int64_t>& offset_E, const std::function<void(int64_t)>& fn,
                     const std::vector<uint8_t>& skip_E = {});

}  // namespace tiermoe
