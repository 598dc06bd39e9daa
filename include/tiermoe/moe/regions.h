#pragma once
// The remat regions of one MoE layer, and the keep-or-replay decision the
// layer consults. A region is a named piece of the forward; its outputs that
// a backward reads are either kept from the forward or dropped and rebuilt in
// backward by replaying the region from its inputs (bitwise: same kernels,
// same rows per expert, same threads). The regions of a layer named `moe`:
//
//   region         body                      what backward may read (kept or replayed)
//   moe.router     route: logits, top-k      x_TD, logits_TE, probs_TE, weights_TK (never replayed)
//   moe.dispatch   plan + gather x_TD rows   x_ND          (dW13; the input of a w13 replay)
//   moe.w13        h = x . W13^T             h_N2F         (activation backward)
//                  [+ gate/up LoRA]          lora_gate_NR, lora_up_NR (the adapters' dB)
//   moe.act        a = act(h)                a_NF          (dW2; absorbed d score; a w2 replay;
//                                                           the down adapter's dA)
//   moe.w2         y = T(a * s) . W2^T       ypre_ND, rstd_N (post_norm's backward only)
//                  [+ down LoRA]             lora_down_NR  (the down adapter's dB)
//   moe.combine    out = sum_k [w *] y       -- never replayed
//   moe.shared     the shared experts' MLP   its h and a (model/shared_expert.h, beside
//                                            this layer: its input is the router's x_TD)
//
// The routing decision and the combine are never replayed and keep exactly
// what their own backward needs: the plan (permutation indices and score_N,
// made once per forward), and without absorption the W2 output y_ND that
// the scores multiply. So nothing on a replay path reads the W2 output: with
// absorbed scores no backward consumer of y_ND is left and it is freed when
// forward returns, whatever the policy. W2's GEMM re-runs in a replay only
// to rebuild a post-expert norm's inputs (post_norm, never absorbed).
//
// A kept region keeps only outputs some backward (or some replay) reads:
// x_ND only with weight grads, gate/up adapters or a w13 replay, a_NF only
// with weight grads, absorbed scores, a down adapter or a w2 replay.
//
// LoRA on the experts: an adapter's intermediate u = x . A^T is a product of
// the stage the adapter sits on, so it is kept or replayed with that region
// (gate/up with w13, down with w2). A w2 replay for the down adapter re-runs
// the whole W2 stage, base GEMM included, over the same rows (bitwise); only
// policies that drop w2 pay for it. The policy language (none, full, default,
// save:...) and the saved-tensors report live in remat/, above this module.
#include <array>
#include <cstdint>
#include <string_view>

#include "tiermoe/moe/executor.h"

namespace tiermoe {

enum class MoeRegion : uint8_t { router, dispatch, w13, act, w2, combine, shared };
inline constexpr size_t kNumMoeRegions = 7;
inline constexpr std::array<MoeRegion, kNumMoeRegions> kMoeRegions = {
    MoeRegion::router, MoeRegion::dispatch, MoeRegion::w13,   MoeRegion::act,
    MoeRegion::w2,     MoeRegion::combine,  MoeRegion::shared};
std::string_view moe_region_name(MoeRegion r);  // "router", "dispatch", ...
// False for router and combine: they always keep what their backward needs.
bool moe_region_replayable(MoeRegion r);

// Per region: keep its outputs for backward (true) or rebuild them by replay.
// Ignored for router and combine.
class MoeRegionKeep {
 public:
  static MoeRegionKeep all() { return MoeRegionKeep(true); }   // no remat
  static MoeRegionKeep none() { return MoeRegionKeep(false); } // replay every replayable region
  MoeRegionKeep() : MoeRegionKeep(true) {}

  bool operator[](MoeRegion r) const { return keep_[size_t(r)] || !moe_region_replayable(r); }
  MoeRegionKeep& set(MoeRegion r, bool keep) {
    keep_[size_t(r)] = keep;
    return *this;
  }

 private:
  explicit MoeRegionKeep(bool k) { keep_.fill(k); }
  std::array<bool, kNumMoeRegions> keep_;
};

// What one forward keeps and what its backward replays, from the keep
// decisions and what the backward will read (the table in the header comment).
struct MoeRematPlan {
  ExpertSaves routed_keep;       // what the experts' forwards keep
  bool replay_dispatch = false;  // re-gather x_ND from x_TD
  ExpertStages routed_replay;

  // adapted: the expert stages whose LoRA adapter wants gradients.
  static MoeRematPlan make(const MoeRegionKeep& keep, bool absorbed, bool weight_grads,
                           bool post_norm, ExpertAdapted adapted = {});
  bool replays(MoeRegion r) const;
};

// Body runs per region: how often each region's forward body executed (the
// forward's and the replays'), and how many of those were replays in a
// backward. The combine's body runs exactly once per forward and never in a
// replay; that the counters show it is part of the remat contract.
//
// With expert parallelism the dispatch and the combine each exchange rows
// between ranks (a collective): the dispatch sends rows to the experts'
// owners, the combine brings results back, and backward reverses both. A
// replayed dispatch is a replayed collective; the combine's never replays.
struct MoeRegionCounters {
  std::array<int64_t, kNumMoeRegions> runs{}, replays{};
  // Row exchanges (expert parallelism only): forward ones, of which
  // replays, and backward ones (the reversed exchange of the region).
  std::array<int64_t, kNumMoeRegions> exchanges{}, exchange_replays{}, backward_exchanges{};

  int64_t run_count(MoeRegion r) const { return runs[size_t(r)]; }
  int64_t replay_count(MoeRegion r) const { return replays[size_t(r)]; }
  int64_t exchange_count(MoeRegion r) const { return exchanges[size_t(r)]; }
  int64_t exchange_replay_count(MoeRegion r) const { return exchange_replays[size_t(r)]; }
  int64_t backward_exchange_count(MoeRegion r) const { return backward_exchanges[size_t(r)]; }
  void count_run(MoeRegion r) { ++runs[size_t(r)]; }
  void count_replay(MoeRegion r) {
    ++runs[size_t(r)];
    ++replays[size_t(r)];
  }
  void count_exchange(MoeRegion r, bool replay) {
    ++exchanges[size_t(r)];
    if (replay) ++exchange_replays[size_t(r)];
  }
  void count_backward_exchange(MoeRegion r) { ++backward_exchanges[size_t(r)]; }
  void reset() { *this = MoeRegionCounters(); }
};

}  // namespace tiermoe
