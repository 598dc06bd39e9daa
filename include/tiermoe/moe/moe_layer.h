#pragma once
// One MoE layer: route, dispatch, compute, combine (+ optional shared experts,
// a dense MLP added to the output, DeepSeek-V3 style). Forward and backward;
// the layer holds references to its parts and no per-step state: everything a
// forward keeps for its backward lives in the MoeSaved it fills.
//
// Router scores are either absorbed before W2 (combine is then a plain sum and
// the W2 output is not kept) or applied in combine (post-combine: the W2
// output y_ND is kept, since d weights needs it). See DESIGN.md "Absorption rule".
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/moe/dispatch.h"
#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/router.h"
#include "tiermoe/moe/saved.h"

namespace tiermoe {

enum class AbsorbScores { automatic, on, off };
std::string_view absorb_scores_name(AbsorbScores a);  // "auto", "on", "off"
AbsorbScores parse_absorb_scores(std::string_view s, std::string_view where = "--absorb-scores");
// auto absorbs unless the experts carry an output postprocess; on together
// with a postprocess is an Error (the postprocess is scale-invariant and would
// erase the score).
bool resolve_absorb_scores(AbsorbScores mode, bool has_output_postprocess, std::string_view where);

struct MoeLayerConfig {
  AbsorbScores absorb_scores = AbsorbScores::automatic;
  std::string name = "moe";          // appears in errors and saved-tensor reports
  MemoryTracker* tracker = nullptr;  // counts the layer's own tensors; null: the process tracker
};

// What one forward keeps for its backward, by region:
//   <name>          x_TD, logits_TE, probs_TE, weights_TK, score_N, y_ND (post-combine only)
//   <name>.experts  x_ND (weight grads only), h_N2F, a_NF (unscaled) [, ypre_ND, rstd_N]
//   <name>.shared   the shared experts' twins of the above
struct MoeSaved {
  Routing routing;
  DispatchPlan plan;
  SavedTensors layer, routed, shared;
  bool absorbed = false;
  bool weight_grads = false;

  std::vector<SavedTensors::Entry> report() const;
  size_t bytes() const;
  void clear();
};

class MoeLayer {
 public:
  // router may be null: forward then takes the routing from the caller (a
  // fixed router in tests, or a caller that routes itself) and backward
  // returns d weights_TK without propagating into a router.
  MoeLayer(MoeLayerConfig cfg, Router* router, const Dispatcher& dispatcher,
           ExpertExecutor& experts, ExpertExecutor* shared_experts = nullptr);

  const MoeLayerConfig& config() const { return cfg_; }
  bool absorbs_scores() const { return absorbed_; }

  // out_TD = sum_k weights[t, k] * expert_{ids[t, k]}(x_TD[t]) (+ shared(x_TD[t])).
  // weight_grads = false keeps only what dx needs (frozen experts, LoRA).
  Tensor forward(const Tensor& x_TD, MoeSaved& saved, bool weight_grads = true);
  Tensor forward(const Tensor& x_TD, Routing routing, MoeSaved& saved, bool weight_grads = true);

  // dx_TD is written (added to if accumulate). Expert, shared-expert and
  // router parameter grads accumulate (+=) when forward kept weight_grads
  // (the router's always do). dlogits_extra_TE (e.g. the aux loss's) may be
  // undefined. Returns d loss / d weights_TK (score dtype).
  Tensor backward(Tensor& dx_TD, const Tensor& dout_TD, MoeSaved& saved,
                  const Tensor& dlogits_extra_TE = Tensor(), bool accumulate = false);

 private:
  MemoryTracker& tracker() const;

  MoeLayerConfig cfg_;
  Router* router_;
  const Dispatcher* dispatcher_;
  ExpertExecutor* experts_;
  ExpertExecutor* shared_;
  bool absorbed_;
};

}  // namespace tiermoe
