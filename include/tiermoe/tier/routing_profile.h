#pragma once
// RoutingProfile: how many rows each (layer, expert) receives per training
// step, as an exponential moving average over steps (docs/architecture.md, "The
// device tier"). The placement planner reads it to decide which experts are hot.
//
// Layers are the model's MoE layers in order (their ordinal among MoE layers,
// not the decoder layer index), so a model with dense layers has no empty
// rows the planner could waste device memory on.
//
// Within a step, observe() adds each micro-batch's count_E (the dispatch
// plan's rows per expert); end_step() folds the step's sums into the average:
//   first step:  ema_E = counts_E
//   later steps: ema_E = decay * ema_E + (1 - decay) * counts_E
// and measures the routing drift: the L1 distance between each layer's
// normalised profile (ema_E / sum(ema_E); all zeros while the sum is 0)
// before and after, averaged over layers. It lies in [0, 2]; 0 on the first
// step. A step where the hot experts trade places drifts by up to 2.
//
// Not thread-safe: one thread observes (the layers run one after another).
//
// File format (JSON, written atomically):
//   {"format": "tiermoe-routing-profile", "version": 1, "decay": 0.9,
//    "steps": 12, "layers": L, "experts": E, "drift": 0.01,
//    "rows": [[r_00, ..., r_0E-1], ..., [r_L-10, ...]]}
// "drift" is optional (0). Reading is strict: a wrong type, a missing field,
// a shape that disagrees with layers/experts, a negative or non-finite row or
// an unknown version is an Error naming the file and the field.
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace tiermoe {

class RoutingProfile {
 public:
  RoutingProfile(int64_t layers, int64_t experts, double decay = 0.9);

  // Adds count_E (experts entries, each >= 0) to this step's rows of `layer`.
  void observe(int64_t layer, const std::vector<int64_t>& count_E);
  // Folds this step's rows into the average, updates drift(), clears them.
  void end_step();

  int64_t layers() const { return layers_; }
  int64_t experts() const { return experts_; }
  double decay() const { return decay_; }
  int64_t steps() const { return steps_; }               // end_step() calls so far
  double drift() const { return drift_; }                // of the last end_step()
  const std::vector<double>& rows(int64_t layer) const;  // average rows per step, [E]
  double total_rows(int64_t layer) const;                // sum of rows(layer)

  std::string to_json() const;
  // `where` names the source (a file) in errors.
  static RoutingProfile from_json(std::string_view text, const std::string& where);
  // A temporary file, then a rename; a failed write removes the temporary file.
  void save(const std::string& path) const;
  static RoutingProfile load(const std::string& path);

  // A deterministic Zipf-skewed profile, as if one step had been observed:
  // in each layer the experts take a random order (from `seed`) and the
  // expert of rank r (0-based) gets total_rows_per_layer * (r+1)^-s / H rows,
  // H = sum over r of (r+1)^-s. s = 0 is uniform. No expert gets more than
  // `max_rows_per_expert` (top-k routing gives an expert at most one row per
  // token): the top ranks are held there and the rest of the rows shared
  // over the others by the same weights (with s so large the weights vanish,
  // the next ranks fill up in turn). O(experts) a layer.
  static RoutingProfile synthetic(
      int64_t layers, int64_t experts, double total_rows_per_layer, double zipf_s, uint64_t seed,
      double max_rows_per_expert = std::numeric_limits<double>::infinity());

  // Expert parallelism: the profiles of the ranks' experts side by side
  // (same layers and decay; rank order is expert order), and back: experts
  // [first, first + count) of a whole profile. Pending rows are not carried;
  // the joined drift is the largest part's.
  static RoutingProfile join(const std::vector<RoutingProfile>& parts);
  RoutingProfile experts_slice(int64_t first, int64_t count) const;

  bool operator==(const RoutingProfile&) const = default;

 private:
  int64_t layers_, experts_;
  double decay_;
  int64_t steps_ = 0;
  double drift_ = 0;
  std::vector<std::vector<double>> ema_LE;     // (L, E) average rows per step
  std::vector<std::vector<int64_t>> count_LE;  // (L, E) this step's rows so far
};

}  // namespace tiermoe
