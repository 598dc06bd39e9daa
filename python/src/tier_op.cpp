#include "tier_op.h"

#include <algorithm>

#include "tiermoe/core/parallel.h"
#include "tiermoe/tier/cpu_device.h"
#include "tiermoe/tier/cuda_device.h"
#include "tiermoe/tier/planner.h"

namespace tiermoe::py {

TierOp::TierOp(const TierOpConfig& cfg, const ExpertShape& shape, int64_t layers,
               int64_t experts) {
  TIERMOE_CHECK(cfg.memory > 0, "device_memory must be given with a device", "patch",
                "pass device_memory=BYTES, the tier's budget on the device");
  const TrainMode mode = cfg.full ? TrainMode::full : TrainMode::lora;
  const DeviceChoice choice = parse_device_choice(cfg.device, "device");
  const bool cuda = choice.kind == DeviceChoice::Kind::cuda;
  TIERMOE_CHECK(cuda || choice.kind == DeviceChoice::Kind::cpu,
                "device '" + cfg.device + "' is not a device", "patch", "device=\"cpu\" or \"cuda\"");
  const int cores = default_num_threads();
  const int device_threads = cfg.device_threads > 0 ? cfg.device_threads : std::max(1, cores / 2);
  // As `tiermoe train --device` (train/tier_session.cpp): the CPU device
  // shares the cores, a GPU needs one for its staging threads.
  const int host_threads = std::max(1, cores - (cuda ? 1 : device_threads));
  auto make_device = [&](size_t bytes) -> std::unique_ptr<Device> {
    if (cuda) {
      return make_cuda_device(CudaDeviceConfig{.memory_bytes = bytes, .ordinal = choice.ordinal},
                              "device=" + cfg.device);
    }
    return std::make_unique<CpuDevice>(
        CpuDeviceConfig{.memory_bytes = bytes, .threads = device_threads});
  };
  if (cfg.cost) {
    cost_ = *cfg.cost;
  } else {
    cost_.buckets = bucket_ladder(16, ExpertsConfig{}.dw_row_block);
    cost_.host_flops_per_s = measure_host(shape, mode, host_threads);
    const std::unique_ptr<Device> probe =
        make_device(measure_device_bytes(shape, mode, cost_.buckets));
    const DeviceRates r = measure_device(*probe, shape, mode, cost_.buckets, nullptr);
    cost_.device_flops_per_s = r.flops_per_s;
    cost_.link_bytes_per_s = r.link_bytes_per_s;
    cost_.launch_s = r.launch_s;
  }
  device_ = make_device(size_t(cfg.memory));
  DeviceTierConfig tc;
  tc.planner.budget_bytes = size_t(cfg.memory);
  tc.planner.mode = parse_placement_mode(cfg.placement, "placement");
  tc.planner.train = mode;
  tc.cost = cost_;
  tc.host_threads = host_threads;
  std::optional<RoutingProfile> profile;
  if (!cfg.profile_in.empty()) profile = RoutingProfile::load(cfg.profile_in);
  tier_ = std::make_unique<DeviceTier>(*device_, tc, shape, layers, experts, std::move(profile));
}

TierOp::~TierOp() = default;

void TierOp::attach(int64_t layer, MoeOp& op) { op.attach_tier(*tier_, layer); }

TierStepStats TierOp::end_step(bool weights_changed) {
  TierStepStats s = tier_->end_step(weights_changed);
  totals_.add(s);
  return s;
}

}  // namespace tiermoe::py
