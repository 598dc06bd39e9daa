#pragma once
// The device tier of a training run (`tiermoe train --device cpu
// --device-memory BYTES --placement auto|host|device`): the device, the
// start-up cost measurements, and the DeviceTier attached to the model.
// Placement changes where rows are computed, never the results, so the
// checkpoint's recorded run config leaves these settings out: a run may
// resume with another device or none.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "tiermoe/model/causal_lm.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/device_tier.h"

namespace tiermoe {

struct TierRunConfig {
  std::string device = "none";  // none | cpu | cuda
  uint64_t device_memory = 0;   // the device tier's budget; required with a device
  std::string placement = "auto";
  int device_threads = 0;       // CPU device kernel threads (0: half the cores, at least 1)
  int64_t horizon_steps = 50;   // a re-plan must pay for itself within this many steps
  double min_gain = 0.05;       // ... and gain this fraction of the step (hysteresis)
  double profile_decay = 0.9;
  bool replan = true;
  std::string profile_in;   // plan the first step from this routing profile
  std::string profile_out;  // write the routing profile here at the end
  // Rates to plan with instead of measuring at start-up (deterministic plans
  // in tests; the bucket ladder is always 16 .. dw_row_block).
  std::optional<CostModel> cost;
  // Faults injected into the device once it is built (tests).
  DeviceFaults faults;

  bool enabled() const { return device != "none"; }
  void validate() const;  // names the flag
};

// The device tier's view of a model's routed experts: D, F, the dtype and
// the family's activation (gpt-oss's clamped GLU brings b13 and b2 beside
// the weights). The memory plan, the sessions and the tests build it here.
ExpertShape expert_shape(const ModelConfig& config, DType dtype);

class TierSession {
 public:
  // Builds the device and the tier for `model` (full_ft: the experts train)
  // and attaches it; measures the cost model unless the config gives one.
  // `profile` (a resumed checkpoint's) wins over config.profile_in. The
  // measurements show a progress line on `log` when they take over a second
  // (rewritten in place when progress_tty).
  TierSession(const TierRunConfig& config, CausalLM& model, bool full_ft, std::ostream* log,
              std::optional<RoutingProfile> profile = std::nullopt, bool progress_tty = false);
  // The same for `layers` MoE layers of `experts` experts of `shape`, with
  // nothing attached: each layer's experts attach through tier().attach (the
  // Python package's MoE ops do).
  TierSession(const TierRunConfig& config, const ExpertShape& shape, int64_t layers,
              int64_t experts, bool full_ft, std::ostream* log,
              std::optional<RoutingProfile> profile = std::nullopt, bool progress_tty = false);
  ~TierSession();

  DeviceTier& tier() { return *tier_; }
  Device& device() { return *device_; }
  // A step's stats, into the run's totals.
  void record(const TierStepStats& s) { run_.add(s); }
  // The run's totals for the --json summary, in the per-step metrics' format
  // (the contract's keys: hot_fraction, device_calls, bytes_up, bytes_down,
  // replacements, and the time split), with the tier's settings.
  nlohmann::json summary_json() const;
  // Writes --profile-out (if given).
  void finish(std::ostream* log) const;

 private:
  TierRunConfig config_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<DeviceTier> tier_;
  TierStepStats run_;
};

}  // namespace tiermoe
