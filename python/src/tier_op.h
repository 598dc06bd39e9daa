#pragma once
// The device tier of one model's MoE ops, from Python (tiermoe.torch.patch's
// device=, device_memory=, placement=): the device (its CPU backend, or CUDA
// where the build has it), the cost model (measured at start-up, as `tiermoe
// train --device` does, or given), and a DeviceTier that each op's experts
// attach to in layer order. Placement changes where rows are computed, never
// the results. The Python side calls begin_step before a step's first
// forward and end_step after the optimizer step.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "moe_op.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/device.h"
#include "tiermoe/tier/device_tier.h"
#include "tiermoe/tier/routing_profile.h"

namespace tiermoe::py {

struct TierOpConfig {
  std::string device = "cpu";  // cpu | cuda[:N]
  uint64_t memory = 0;         // the tier's byte budget on the device
  std::string placement = "auto";
  bool full = false;                 // the experts train (their dW runs on the device)
  std::optional<CostModel> cost;     // rates to plan with; unset: measured now
  std::string profile_in;            // plan the first step from this routing profile
  int device_threads = 0;            // CPU device: kernel threads (0: half the cores)
};

class TierOp {
 public:
  TierOp(const TierOpConfig& cfg, const ExpertShape& shape, int64_t layers, int64_t experts);
  ~TierOp();
  TierOp(const TierOp&) = delete;
  TierOp& operator=(const TierOp&) = delete;

  void attach(int64_t layer, MoeOp& op);
  void begin_step() { tier_->begin_step(); }
  TierStepStats end_step(bool weights_changed);
  const TierStepStats& totals() const { return totals_; }
  DeviceTier& tier() { return *tier_; }
  const CostModel& cost() const { return cost_; }

 private:
  std::unique_ptr<Device> device_;
  std::unique_ptr<DeviceTier> tier_;
  CostModel cost_;
  TierStepStats totals_;
};

}  // namespace tiermoe::py
