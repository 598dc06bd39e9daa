#pragma once
// One MoE layer: route, dispatch, compute, combine. Forward and backward; the
// layer holds references to its parts and no per-step state: everything a
// forward keeps for its backward lives in the MoeSaved it fills. Shared
// experts (DeepSeek-V3 style) are the model's (model/shared_expert.h), added
// beside this layer's output.
//
// Router scores are either absorbed before W2 (combine is then a plain sum and
// the W2 output is not kept) or applied in combine (post-combine: the W2
// output y_ND is kept, since d weights needs it). See docs/architecture.md
// ("Absorption rule").
//
// Remat: the forward is cut into named regions (moe/regions.h); the config's
// `keep` says per region whether its outputs are kept for backward or rebuilt
// by replaying it. The result is bitwise the same either way.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/core/step_times.h"
#include "tiermoe/moe/dispatch.h"
#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/regions.h"
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
  MoeRegionKeep keep;                // remat: per region, keep or replay (default: keep all)
};

// One retained thing of a forward, as the remat report lists it.
struct MoeSavedItem {
  MoeRegion region;
  std::string name;   // "h_N2F"
  std::string dtype;  // "bf16", "f32", "f64"; "i32" / "i64" for the plan's index arrays
  Shape shape;
  size_t bytes = 0;
  // A Tensor counted under MemTag::saved; false for the plan's index arrays
  // (host std::vectors no MemoryTracker sees).
  bool tracked = true;
};

// What one forward keeps for its backward. The records hold tensors; which
// region each belongs to is items()'s business:
//   layer   x_TD, logits_TE, probs_TE, weights_TK (router), score_N (w2 when
//           absorbed, else combine), y_ND (combine, post-combine only);
//           with expert parallelism and absorbed scores score_S, the scores
//           of the rows this rank's experts received (w2)
//   routed  one record per source segment of the received rows (one
//           without expert parallelism): x_ND (dispatch), h_N2F (w13), a_NF
//           (act), ypre_ND, rstd_N (w2)
// Only what the remat plan keeps is there; backward rebuilds the rest.
struct MoeSaved {
  Routing routing;
  DispatchPlan plan;
  ExpertExchange exchange;  // where the plan's rows went (dispatch.h)
  SavedTensors layer;
  std::vector<SavedTensors> routed;  // per source segment
  bool absorbed = false;
  bool weight_grads = false;
  bool adapter_grads = false;  // the experts carry an adapter and a backward wants its grads
  MoeRematPlan remat;

  // Every retained tensor once (a storage two records share is listed under
  // the first), then the plan's index arrays; in region order.
  std::vector<MoeSavedItem> items() const;
  size_t bytes() const;  // the tracked items' bytes: what the records hold under MemTag::saved
  void clear();
};

class MoeLayer {
 public:
  // router may be null: forward then takes the routing from the caller (a
  // fixed router in tests, or a caller that routes itself) and backward
  // returns d weights_TK without propagating into a router.
  MoeLayer(MoeLayerConfig cfg, Router* router, const Dispatcher& dispatcher,
           ExpertExecutor& experts);

  const MoeLayerConfig& config() const { return cfg_; }
  bool absorbs_scores() const { return absorbed_; }
  // Changes the absorption mode and the remat decisions for the following
  // forwards (a forward's MoeSaved records what it did, so a pending
  // backward is unaffected).
  void set_options(AbsorbScores absorb, const MoeRegionKeep& keep);
  // Runs the routed experts on `experts` from the next forward on (e.g. the
  // device tier's TieredExperts over the same GroupedExperts). It must have
  // this layer's expert count, hidden size, dtype and postprocess. With an
  // expert-parallel dispatcher the executor holds this rank's experts only
  // (E / ranks), and the router all E.
  void set_experts(ExpertExecutor& experts);
  // Region body runs since construction or the last reset (not thread-safe:
  // a layer runs one forward or backward at a time).
  const MoeRegionCounters& counters() const { return counters_; }
  void reset_counters() { counters_.reset(); }
  // Where forward and backward add their wall time: router, dispatch (plan,
  // gather, combine, all-to-alls) and experts (replays included); null:
  // nowhere.
  void set_step_times(StepTimes* times) { times_ = times; }

  // out_TD = sum_k weights[t, k] * expert_{ids[t, k]}(x_TD[t]).
  // weight_grads = false keeps only what dx needs (frozen experts, LoRA).
  // adapter_grads: a backward wants the gradients of the experts' LoRA
  // adapter, if they carry one (its saves are kept; false: evaluation).
  // Counts one run of the router (first overload only), dispatch, w13, act,
  // w2 and combine bodies.
  Tensor forward(const Tensor& x_TD, MoeSaved& saved, bool weight_grads = true,
                 bool adapter_grads = true);
  Tensor forward(const Tensor& x_TD, Routing routing, MoeSaved& saved, bool weight_grads = true,
                 bool adapter_grads = true);

  // dx_TD is written (added to if accumulate). Expert and router parameter
  // grads accumulate (+=) when forward kept weight_grads
  // (the router's always do). dlogits_extra_TE (e.g. the aux loss's) may be
  // undefined. Returns d loss / d weights_TK (score dtype). First replays
  // what the forward did not keep (saved.remat), each region at most once;
  // the rebuilt tensors are held (as MemTag::saved) only while backward runs,
  // so `saved` is unchanged and a second backward replays again.
  Tensor backward(Tensor& dx_TD, const Tensor& dout_TD, MoeSaved& saved,
                  const Tensor& dlogits_extra_TE = Tensor(), bool accumulate = false);

 private:
  MemoryTracker& tracker() const;
  // Rebuilds into `routed` what backward reads and forward did not keep.
  void replay_routed(std::vector<SavedTensors>& routed, const MoeSaved& saved);
  // The record of source rank s's rows ("moe.experts", "moe.experts.from1").
  std::string segment_record_name(int source) const;
  // The absorbed scores of the rows this rank's experts computed (undefined
  // when not absorbed).
  Tensor received_scores(const MoeSaved& saved) const;

  MoeLayerConfig cfg_;
  Router* router_;
  const Dispatcher* dispatcher_;
  ExpertExecutor* experts_;
  bool absorbed_;
  MoeRegionCounters counters_;
  StepTimes* times_ = nullptr;
};

}  // namespace tiermoe
