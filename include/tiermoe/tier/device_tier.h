#pragma once
// DeviceTier: the device tier of a whole model. It owns the workspace, the
// routing profile and the planner, hands each MoE layer a TieredExperts over
// its GroupedExperts, and between steps keeps the placement right:
//   end_step(): full fine-tuning's updated weights go back up to the device;
//               the step's routed rows fold into the profile; the planner
//               re-plans and, when the gain over its horizon beats the cost of
//               moving weights, experts move in and out.
// A device fault never changes a result (TieredExperts redoes the work on
// the host); an out-of-memory while moving experts shrinks the planner's
// budget to what fitted.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/device.h"
#include "tiermoe/tier/planner.h"
#include "tiermoe/tier/routing_profile.h"
#include "tiermoe/tier/tiered_experts.h"

namespace tiermoe {

struct DeviceTierConfig {
  PlannerConfig planner;  // budget, mode, train mode, horizon, hysteresis
  CostModel cost;         // measured at start-up (cost_model.h) or given
  double profile_decay = 0.9;
  // Host threads while the device runs (0: unchanged): a CPU device shares
  // the cores, so the host gives up the device's.
  int host_threads = 0;
  bool replan = true;  // false: keep the first placement
};

// What the tier did in one step (all layers), for the metrics JSONL.
struct TierStepStats {
  std::vector<TierLayerStats> layers;
  TierLayerStats total;
  double drift = 0;             // routing drift at this step's end (L1, normalised)
  int64_t resident = 0;         // experts resident after the step
  std::vector<std::vector<int64_t>> resident_experts;  // [layer]: the ids resident after it
  int64_t replacements = 0;     // placements applied: before the first step, at its end
  int64_t moved_in = 0, moved_out = 0;
  size_t bytes_moved = 0;       // weights uploaded for experts moving in
  double move_s = 0;            // time spent moving them
  size_t bytes_synced = 0;      // full FT: updated weights re-uploaded
  double sync_s = 0;
  double predicted_step_s = 0;  // the planner's step time for the placement now
  int64_t faults = 0;           // device faults (launches and allocations)
  // A later step's stats into these (a run's totals): counts, bytes and
  // times add up, per layer too; drift, resident and the prediction are the
  // later step's.
  void add(const TierStepStats& later);
};

class DeviceTier {
 public:
  // `profile_in`: a profile to plan the first step from (else the first step
  // runs on the host while the profile fills).
  DeviceTier(Device& device, DeviceTierConfig config, ExpertShape shape, int64_t layers,
             int64_t experts, std::optional<RoutingProfile> profile_in = std::nullopt);
  ~DeviceTier();
  DeviceTier(const DeviceTier&) = delete;
  DeviceTier& operator=(const DeviceTier&) = delete;

  // Layer `layer`'s executor (the tier observes its routing).
  TieredExperts& attach(int64_t layer, GroupedExperts& experts, HostExperts& host);
  // Call before a step's first forward: after a fault the device is tried again.
  void begin_step();
  // Call after the optimizer step; `weights_changed` when the experts trained.
  TierStepStats end_step(bool weights_changed);

  Device& device() { return *device_; }
  RoutingProfile& profile() { return profile_; }
  const RoutingProfile& profile() const { return profile_; }
  // What the attached layers hold now (each TieredExperts keeps its own).
  Placement placement() const;
  const PlacementPlanner& planner() const { return planner_; }
  const DeviceTierConfig& config() const { return config_; }
  // Whether any attached layer can run on the device at all (experts with a
  // LoRA adapter or an output postprocess stay on the host).
  bool any_device_capable() const;

 private:
  // Makes `target` resident, layer by layer; on DeviceOutOfMemory keeps what
  // fitted and shrinks the budget. Returns whether any expert moved.
  bool apply(const Placement& target, TierStepStats& stats);

  Device* device_;
  DeviceTierConfig config_;
  ExpertShape shape_;
  int64_t layers_, experts_;
  std::vector<int64_t> buckets_;
  TierWorkspace workspace_;
  RoutingProfile profile_;
  PlacementPlanner planner_;
  std::vector<std::unique_ptr<TieredExperts>> tiered_;  // per layer; null until attached
  TierStepStats pending_;  // moves made by begin_step(), reported with the step
};

}  // namespace tiermoe
