#include "tiermoe/tier/device_tier.h"

#include <algorithm>

#include "tiermoe/core/timer.h"

namespace tiermoe {

DeviceTier::DeviceTier(Device& device, DeviceTierConfig config, ExpertShape shape, int64_t layers,
                       int64_t experts, std::optional<RoutingProfile> profile_in)
    : device_(&device),
      config_(std::move(config)),
      shape_(shape),
      layers_(layers),
      experts_(experts),
      buckets_(config_.cost.buckets),
      workspace_(device, shape, config_.cost.largest_bucket()),
      profile_(profile_in ? std::move(*profile_in)
                          : RoutingProfile(layers, experts, config_.profile_decay)),
      planner_(config_.planner, shape, layers, experts, config_.cost),
      tiered_(size_t(layers)) {
  TIERMOE_CHECK(profile_.layers() == layers && profile_.experts() == experts,
                detail::str_of("the routing profile has ", profile_.layers(), " layers x ",
                               profile_.experts(), " experts, the model ", layers, " x ", experts),
                "--profile-in", "use a profile recorded with this model (or drop --profile-in)");
}

DeviceTier::~DeviceTier() {
  // The executors free their device memory before the workspace goes.
  tiered_.clear();
}

TieredExperts& DeviceTier::attach(int64_t layer, GroupedExperts& experts, HostExperts& host) {
  TIERMOE_CHECK(layer >= 0 && layer < layers_ && !tiered_[size_t(layer)],
                detail::str_of("layer ", layer, " attached twice or out of 0..", layers_ - 1),
                "device tier", "attach each MoE layer once");
  auto t = std::make_unique<TieredExperts>(experts, host, *device_, workspace_, buckets_);
  t->set_host_threads(config_.host_threads);
  t->set_observer([this, layer](const std::vector<int64_t>& count_E) {
    profile_.observe(layer, count_E);
  });
  tiered_[size_t(layer)] = std::move(t);
  return *tiered_[size_t(layer)];
}

void TierStepStats::add(const TierStepStats& later) {
  if (layers.size() < later.layers.size()) layers.resize(later.layers.size());
  for (size_t l = 0; l < later.layers.size(); ++l) layers[l].add(later.layers[l]);
  total.add(later.total);
  drift = later.drift;
  resident = later.resident;
  resident_experts = later.resident_experts;
  replacements += later.replacements;
  moved_in += later.moved_in;
  moved_out += later.moved_out;
  bytes_moved += later.bytes_moved;
  move_s += later.move_s;
  bytes_synced += later.bytes_synced;
  sync_s += later.sync_s;
  predicted_step_s = later.predicted_step_s;
  faults += later.faults;
}

Placement DeviceTier::placement() const {
  Placement p = Placement::none(layers_, experts_);
  for (int64_t l = 0; l < layers_; ++l) {
    if (const TieredExperts* t = tiered_[size_t(l)].get()) p.resident[size_t(l)] = t->resident();
  }
  return p;
}

bool DeviceTier::any_device_capable() const {
  return std::any_of(tiered_.begin(), tiered_.end(),
                     [](const auto& t) { return t && t->device_capable(); });
}

void DeviceTier::begin_step() {
  for (auto& t : tiered_) {
    if (t) t->begin_step();
  }
  // A profile given up front (or restored) places experts before the first step.
  if (placement().count() == 0 && profile_.steps() > 0 &&
      config_.planner.mode != PlacementMode::host && any_device_capable()) {
    const Placement first = planner_.plan(profile_);
    if (first.count() > 0 && apply(first, pending_)) ++pending_.replacements;
  }
}

bool DeviceTier::apply(const Placement& target, TierStepStats& stats) {
  const bool with_grads = config_.planner.train == TrainMode::full;
  const auto t0 = Clock::now();
  const Placement before = placement();
  // Experts with a LoRA adapter or a postprocess stay on the host.
  auto capable = [&](int64_t l) {
    const TieredExperts* t = tiered_[size_t(l)].get();
    return t && t->device_capable();
  };
  // Evictions first, so the memory they free is there for the experts moving in.
  for (int64_t l = 0; l < layers_; ++l) {
    if (!capable(l)) continue;
    TieredExperts& t = *tiered_[size_t(l)];
    std::vector<uint8_t> keep = t.resident();
    for (size_t e = 0; e < keep.size(); ++e) keep[e] = keep[e] && target.resident[size_t(l)][e];
    t.set_resident(keep, with_grads);
  }
  for (int64_t l = 0; l < layers_; ++l) {
    if (!capable(l)) continue;
    TieredExperts& t = *tiered_[size_t(l)];
    try {
      stats.bytes_moved += t.set_resident(target.resident[size_t(l)], with_grads);
    } catch (const DeviceOutOfMemory&) {
      // What fitted stays; plan within it from now on.
      ++stats.faults;
      planner_.shrink_budget(device_->used());
    }
  }
  const Placement after = placement();
  int64_t moved = 0;
  for (int64_t l = 0; l < layers_; ++l) {
    for (int64_t e = 0; e < experts_; ++e) {
      const bool was = before.is_resident(l, e), now = after.is_resident(l, e);
      stats.moved_in += now && !was;
      stats.moved_out += was && !now;
      moved += now != was;
    }
  }
  stats.move_s += seconds_since(t0);
  return moved > 0;
}

TierStepStats DeviceTier::end_step(bool weights_changed) {
  // Moves made before the step's first forward count with the step.
  TierStepStats s = std::move(pending_);
  pending_ = {};
  for (auto& t : tiered_) {
    s.layers.push_back(t ? t->take_stats() : TierLayerStats{});
    s.total.add(s.layers.back());
  }
  s.faults += s.total.faults;
  if (weights_changed && config_.planner.train == TrainMode::full) {
    const auto t0 = Clock::now();
    for (auto& t : tiered_) {
      if (t) s.bytes_synced += t->upload_weights();
    }
    s.sync_s = seconds_since(t0);
  }
  profile_.end_step();
  s.drift = profile_.drift();
  const Placement current = placement();
  if (config_.planner.mode != PlacementMode::host && any_device_capable() &&
      (config_.replan || current.count() == 0)) {
    std::optional<Placement> target;
    if (current.count() == 0) {
      Placement first = planner_.plan(profile_);
      if (first.count() > 0) target = std::move(first);
    } else if (auto r = planner_.replan(current, profile_)) {
      target = std::move(r->placement);
    }
    if (target && apply(*target, s)) ++s.replacements;
  }
  const Placement now = placement();
  s.resident = now.count();
  for (const std::vector<uint8_t>& on_E : now.resident) {
    std::vector<int64_t>& ids = s.resident_experts.emplace_back();
    for (size_t e = 0; e < on_E.size(); ++e) {
      if (on_E[e]) ids.push_back(int64_t(e));
    }
  }
  s.predicted_step_s = planner_.predict(now, profile_).step_s;
  return s;
}

}  // namespace tiermoe
