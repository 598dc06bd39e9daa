#pragma once
// PlacementPlanner: which experts are resident on the device, chosen from the
// routing profile and the cost model under the device byte budget (docs/architecture.md,
// "The device tier").
//
// Prediction (cost_model.h for the per-expert terms). Within a layer the host
// runs the rows of non-resident experts while the device runs the resident
// ones, so the layer takes
//   makespan = max(host_s, device_s + transfer_s)
//   host_s     = sum over non-resident e of host_seconds(rows_e)
//   device_s   = sum over resident e of device_seconds(rows_e / micro_batches)
//                * micro_batches (padding is per call, and a step makes one
//                call per micro-batch)
//   transfer_s = sum over resident e of transfer_seconds(rows_e)
// Layers run one after another, so the step is the sum of the makespans,
// plus for full fine-tuning each resident expert's weight sync. An average
// row count between two integers M and M+1 costs the linear interpolation of
// the device times at M and M+1 (a profile of 0.3 rows is an expert hit in
// about 30% of the steps).
//
// Memory: a non-empty placement holds the workspace once (bytes_workspace at
// the largest bucket) plus bytes_resident per resident expert; no plan ever
// exceeds the budget.
//
// Modes: host places nothing; device places as many as fit, hottest first
// across all layers (ties: lower layer, then lower expert); auto minimises
// the predicted step time greedily: starting from nothing, it repeatedly
// makes resident the (layer, expert) whose move lowers the predicted step
// time the most (ties: hotter first, then lower layer and expert), and stops
// when no move lowers it or the next expert would exceed the budget. Only the
// moved expert's layer changes, so each round re-scores one layer.
//
// Re-planning between steps (hysteresis): the new best plan replaces the
// current one only when its predicted gain per step, over horizon_steps,
// pays for uploading the experts that move in, AND the gain is at least
// min_gain of the current predicted step time. A current placement over the
// budget (after shrink_budget) is always replaced.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/routing_profile.h"

namespace tiermoe {

enum class PlacementMode { auto_, host, device };
std::string_view placement_mode_name(PlacementMode m);                           // "auto", ...
PlacementMode parse_placement_mode(std::string_view s, std::string_view where);  // Error otherwise

struct Placement {
  std::vector<std::vector<uint8_t>> resident;  // [layer][expert], 1 = on the device
  static Placement none(int64_t layers, int64_t experts);
  int64_t count() const;
  int64_t count(int64_t layer) const;
  bool is_resident(int64_t layer, int64_t expert) const {
    return resident[size_t(layer)][size_t(expert)] != 0;
  }
  bool operator==(const Placement&) const = default;
};

struct PlannerConfig {
  size_t budget_bytes = 0;  // device memory the expert tier may hold
  PlacementMode mode = PlacementMode::auto_;
  TrainMode train = TrainMode::lora;
  // Steps a re-plan is expected to stay good for: its gain over them must pay
  // for the weights it uploads.
  int64_t horizon_steps = 50;
  // Hysteresis: a re-plan must gain at least this fraction of the current
  // predicted step time, so noise in the profile does not move weights.
  double min_gain = 0.05;
  // Expert calls per step (gradient accumulation): padding is per call.
  int64_t micro_batches = 1;
  void validate(std::string_view where) const;
};

struct LayerPrediction {
  double host_s = 0, device_s = 0, transfer_s = 0, makespan_s = 0;
  double hot_fraction = 0;  // of the layer's rows, on the device (0 with no rows)
};

struct PlanPrediction {
  std::vector<LayerPrediction> layers;
  double sync_s = 0;        // full fine-tuning's weight sync of resident experts
  double step_s = 0;        // sum of makespans + sync_s
  double hot_fraction = 0;  // of all rows, on the device
  size_t bytes = 0;         // device memory of the placement
};

struct Replan {
  Placement placement;
  double gain_s_per_step = 0;  // predicted current step_s minus the new one
  double move_s = 0;           // uploading the experts that move in
  size_t bytes_moved = 0;
  int64_t moved_in = 0, moved_out = 0;
};

class PlacementPlanner {
 public:
  PlacementPlanner(PlannerConfig config, ExpertShape shape, int64_t layers, int64_t experts,
                   CostModel cost);

  Placement plan(const RoutingProfile& profile) const;
  PlanPrediction predict(const Placement& placement, const RoutingProfile& profile) const;
  std::optional<Replan> replan(const Placement& current, const RoutingProfile& profile) const;

  // Lowers the budget (e.g. after the device ran out of memory); never raises it.
  void shrink_budget(size_t bytes);
  size_t budget() const { return config_.budget_bytes; }
  // Device memory of a placement with `resident` experts (0 for none).
  size_t bytes_for(int64_t resident) const;
  // The most experts the budget holds.
  int64_t capacity() const;

  const PlannerConfig& config() const { return config_; }
  const ExpertShape& shape() const { return shape_; }
  const CostModel& cost() const { return cost_; }

 private:
  void check_profile(const RoutingProfile& profile) const;
  void check_placement(const Placement& placement) const;
  double host_s(double rows) const;
  double device_s(double rows) const;  // interpolated, per micro-batch calls
  double transfer_s(double rows) const;
  LayerPrediction predict_layer(const std::vector<uint8_t>& resident_E,
                                const std::vector<double>& rows_E) const;
  Placement plan_device(const RoutingProfile& profile) const;
  Placement plan_auto(const RoutingProfile& profile) const;

  PlannerConfig config_;
  ExpertShape shape_;
  int64_t layers_, experts_;
  CostModel cost_;
};

}  // namespace tiermoe
