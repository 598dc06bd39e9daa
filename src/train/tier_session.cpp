#include "tiermoe/train/tier_session.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/tier/cpu_device.h"
#include "tiermoe/tier/cuda_device.h"
#include "tiermoe/train/metrics.h"

namespace tiermoe {

using detail::str_of;
using nlohmann::json;

void TierRunConfig::validate() const {
  const DeviceChoice choice = parse_device_choice(device, "--device");
  parse_placement_mode(placement, "--placement");
  if (!enabled()) return;
  if (choice.kind == DeviceChoice::Kind::cuda) {
    // Before any model is loaded: a build or machine without CUDA says so at once.
    std::string why;
    TIERMOE_CHECK(cuda_device_count(&why) > 0, why, "--device " + device,
                  cuda_backend_built()
                      ? "run on a machine with an NVIDIA GPU and its driver (nvidia-smi lists "
                        "it), or use --device cpu"
                      : "install the CUDA toolkit and rebuild (make build "
                        "CMAKE_ARGS=-DTIERMOE_CUDA=ON), or use --device cpu");
  }
  TIERMOE_CHECK(device_memory > 0, "--device needs --device-memory", "--device-memory",
                "give the device tier's budget, e.g. --device-memory 2GiB");
  TIERMOE_CHECK(device_threads >= 0, "--device-threads must be >= 0", "--device-threads",
                "0 takes half the cores");
  TIERMOE_CHECK(horizon_steps >= 1 && min_gain >= 0 && profile_decay >= 0 && profile_decay < 1,
                str_of("re-plan settings out of range: horizon ", horizon_steps, ", min gain ",
                       min_gain, ", profile decay ", profile_decay),
                "--replan-horizon/--replan-min-gain/--profile-decay",
                "horizon >= 1, min gain >= 0, 0 <= decay < 1");
}

ExpertShape expert_shape(const ModelConfig& c, DType dtype) {
  const bool clamped = c.spec().clamped_experts;
  return {.D = c.hidden_size,
          .F = c.moe_intermediate_size,
          .dtype = dtype,
          .bias = clamped,
          .activation = clamped ? ExpertActivation::gpt_oss : ExpertActivation::swiglu};
}

namespace {

ExpertShape expert_shape(const CausalLM& model) {
  ExpertShape s = expert_shape(model.config(), model.dtype());
  s.absorb = model.absorb_scores() != AbsorbScores::off;
  s.quant = model.expert_quant();
  return s;
}

}  // namespace

TierSession::TierSession(const TierRunConfig& config, CausalLM& model, bool full_ft,
                         std::ostream* log, std::optional<RoutingProfile> profile,
                         bool progress_tty)
    // With expert parallelism the tier runs this rank's experts only.
    : TierSession(config, expert_shape(model), model.num_moe_layers(), model.local_experts(),
                  full_ft, log, std::move(profile), progress_tty) {
  model.attach_device_tier(*tier_);
  if (log && !tier_->any_device_capable()) {
    *log << "tier: note: every MoE layer's experts carry a LoRA adapter (gate/up/down_proj in "
            "--lora-targets), which the device graphs do not run: all experts stay on the host\n";
  }
}

TierSession::TierSession(const TierRunConfig& config, const ExpertShape& shape, int64_t layers,
                         int64_t experts, bool full_ft, std::ostream* log,
                         std::optional<RoutingProfile> profile, bool progress_tty)
    : config_(config) {
  // Quantized experts stay at their width on a device that holds them so
  // (Device::holds_quantized), else they go up widened: the device's shape
  // is what it holds. The host's is the run's.
  ExpertShape widened = shape;
  widened.quant.reset();
  auto held_by = [&](const Device& d) { return d.holds_quantized() ? shape : widened; };
  config_.validate();
  const TrainMode mode = full_ft ? TrainMode::full : TrainMode::lora;
  const DeviceChoice choice = parse_device_choice(config_.device, "--device");
  const bool cuda = choice.kind == DeviceChoice::Kind::cuda;
  const int cores = default_num_threads();
  const int device_threads = config_.device_threads > 0 ? config_.device_threads
                                                        : std::max(1, cores / 2);
  // The CPU device shares the cores: the host gives it its threads while both
  // run. A GPU needs one core for its staging threads (pinned copies).
  const int host_threads = std::max(1, cores - (cuda ? 1 : device_threads));
  // The device, or a probe of its kind for the start-up measurements (a
  // device of its own, so the tier's budget is untouched).
  auto make_device = [&](size_t bytes) -> std::unique_ptr<Device> {
    if (cuda) {
      return make_cuda_device(CudaDeviceConfig{.memory_bytes = bytes, .ordinal = choice.ordinal},
                              "--device " + config_.device);
    }
    return std::make_unique<CpuDevice>(
        CpuDeviceConfig{.memory_bytes = bytes, .threads = device_threads});
  };

  CostModel cost;
  if (config_.cost) {
    cost = *config_.cost;
  } else {
    // Stages: the host, starting the probe device, then measure_device's.
    ProgressMeter meter({log, progress_tty}, "tier: measuring the cost model", 2 + kDeviceMeasures,
                        {.unit = "stages"});
    cost.buckets = bucket_ladder(16, ExpertsConfig{}.dw_row_block);
    cost.host_flops_per_s = measure_host(shape, mode, host_threads);
    meter.advance(1);
    const std::unique_ptr<Device> probe =
        make_device(measure_device_bytes(widened, mode, cost.buckets));  // the larger
    meter.advance(1);
    const DeviceRates r = measure_device(*probe, held_by(*probe), mode, cost.buckets, &meter);
    meter.finish();
    cost.device_flops_per_s = r.flops_per_s;
    cost.link_bytes_per_s = r.link_bytes_per_s;
    cost.launch_s = r.launch_s;
  }
  device_ = make_device(size_t(config_.device_memory));
  if (log) {
    const std::string what =
        cuda ? str_of(device_->name(), " device (", cuda_device_summary(choice.ordinal),
                      "), host keeps ", host_threads, " thread(s)")
             : str_of("cpu device, ", device_threads, " kernel thread(s) (host keeps ",
                      host_threads, " while it runs)");
    *log << str_of("tier: ", what, ", budget ", config_.device_memory, " bytes\n",
                   "tier: cost model", config_.cost ? " (given)" : " (measured)", ": host ",
                   cost.host_flops_per_s / 1e9, " GFLOP/s, device ",
                   cost.device_flops_per_s / 1e9, " GFLOP/s, link ",
                   cost.link_bytes_per_s / 1e9, " GB/s, launch ", cost.launch_s * 1e6, " us\n");
  }

  if (log && shape.quant) {
    const ExpertShape held = held_by(*device_);
    *log << str_of(
        "tier: a resident expert holds ", bytes_resident(held, mode), " bytes (",
        held.quant ? held.quant->str() : "widened: this device holds no quantized graphs", "; ",
        bytes_resident(widened, mode), " widened)\n");
  }

  DeviceTierConfig tc;
  tc.planner.budget_bytes = size_t(config_.device_memory);
  tc.planner.mode = parse_placement_mode(config_.placement, "--placement");
  tc.planner.train = mode;
  tc.planner.horizon_steps = config_.horizon_steps;
  tc.planner.min_gain = config_.min_gain;
  tc.cost = cost;
  tc.profile_decay = config_.profile_decay;
  tc.host_threads = host_threads;
  tc.replan = config_.replan;
  if (!profile && !config_.profile_in.empty()) profile = RoutingProfile::load(config_.profile_in);
  tier_ = std::make_unique<DeviceTier>(*device_, tc, held_by(*device_), layers, experts,
                                       std::move(profile));
  device_->inject(config_.faults);
}

TierSession::~TierSession() {
  tier_.reset();  // frees its device memory before the device goes
}

json TierSession::summary_json() const {
  json j = tier_step_json(run_);
  j["device"] = device_->name();
  j["placement"] = config_.placement;
  j["device_memory"] = config_.device_memory;
  // The rates the planner predicted with (measured at start-up unless given).
  const CostModel& c = tier_->config().cost;
  j["rates"] = {{"host_flops_per_s", c.host_flops_per_s},
                {"device_flops_per_s", c.device_flops_per_s},
                {"link_bytes_per_s", c.link_bytes_per_s},
                {"launch_s", c.launch_s}};
  return j;
}

void TierSession::finish(std::ostream* log) const {
  if (config_.profile_out.empty()) return;
  tier_->profile().save(config_.profile_out);
  if (log) *log << "tier: routing profile written to " << config_.profile_out << "\n";
}

}  // namespace tiermoe
