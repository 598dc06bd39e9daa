#include "tiermoe/tier/planner.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "tiermoe/core/error.h"

namespace tiermoe {

using detail::str_of;

std::string_view placement_mode_name(PlacementMode m) {
  switch (m) {
    case PlacementMode::auto_: return "auto";
    case PlacementMode::host: return "host";
    case PlacementMode::device: return "device";
  }
  return "?";
}

PlacementMode parse_placement_mode(std::string_view s, std::string_view where) {
  if (s == "auto") return PlacementMode::auto_;
  if (s == "host") return PlacementMode::host;
  if (s == "device") return PlacementMode::device;
  throw Error(str_of("unknown placement '", s, "'"), std::string(where),
              "auto (the planner decides), host (no expert on the device) or device (as many "
              "as fit, hottest first)");
}

Placement Placement::none(int64_t layers, int64_t experts) {
  Placement p;
  p.resident.assign(size_t(layers), std::vector<uint8_t>(size_t(experts), 0));
  return p;
}

int64_t Placement::count(int64_t layer) const {
  const std::vector<uint8_t>& r = resident[size_t(layer)];
  return std::count_if(r.begin(), r.end(), [](uint8_t v) { return v != 0; });
}

int64_t Placement::count() const {
  int64_t n = 0;
  for (size_t l = 0; l < resident.size(); ++l) n += count(int64_t(l));
  return n;
}

void PlannerConfig::validate(std::string_view where) const {
  const std::string at(where);
  TIERMOE_CHECK(horizon_steps >= 1, str_of("horizon_steps is ", horizon_steps), at,
                "a re-plan must pay for itself over at least one step");
  TIERMOE_CHECK(std::isfinite(min_gain) && min_gain >= 0 && min_gain < 1,
                str_of("min_gain is ", min_gain), at,
                "a fraction of the step time in [0, 1), e.g. 0.05");
  TIERMOE_CHECK(micro_batches >= 1, str_of("micro_batches is ", micro_batches), at,
                "one expert call per micro-batch, at least one per step");
}

PlacementPlanner::PlacementPlanner(PlannerConfig config, ExpertShape shape, int64_t layers,
                                   int64_t experts, CostModel cost)
    : config_(config), shape_(shape), layers_(layers), experts_(experts), cost_(std::move(cost)) {
  config_.validate("PlannerConfig");
  cost_.validate("CostModel");
  TIERMOE_CHECK(layers > 0 && experts > 0 && shape.D > 0 && shape.F > 0,
                str_of("planner for ", layers, " layers of ", experts, " experts, D ", shape.D,
                       " F ", shape.F),
                "PlacementPlanner", "pass the model's MoE layers, experts and expert shape");
}

void PlacementPlanner::shrink_budget(size_t bytes) {
  config_.budget_bytes = std::min(config_.budget_bytes, bytes);
}

size_t PlacementPlanner::bytes_for(int64_t resident) const {
  if (resident == 0) return 0;
  return bytes_workspace(shape_, cost_.largest_bucket()) +
         size_t(resident) * bytes_resident(shape_, config_.train);
}

int64_t PlacementPlanner::capacity() const {
  const size_t ws = bytes_workspace(shape_, cost_.largest_bucket());
  const size_t per = bytes_resident(shape_, config_.train);
  if (config_.budget_bytes < ws + per) return 0;
  return std::min<int64_t>(int64_t((config_.budget_bytes - ws) / per), layers_ * experts_);
}

void PlacementPlanner::check_profile(const RoutingProfile& profile) const {
  TIERMOE_CHECK(profile.layers() == layers_ && profile.experts() == experts_,
                str_of("routing profile of ", profile.layers(), " layers x ", profile.experts(),
                       " experts, planner of ", layers_, " x ", experts_),
                "PlacementPlanner", "the profile must come from this model's MoE layers");
}

void PlacementPlanner::check_placement(const Placement& placement) const {
  bool ok = int64_t(placement.resident.size()) == layers_;
  for (const auto& r : placement.resident) ok = ok && int64_t(r.size()) == experts_;
  TIERMOE_CHECK(ok, str_of("placement is not ", layers_, " layers x ", experts_, " experts"),
                "PlacementPlanner", "start from Placement::none(layers, experts) or plan()");
}

double PlacementPlanner::host_s(double rows) const {
  return host_seconds(rows, shape_, config_.train, cost_);
}

double PlacementPlanner::device_s(double rows) const {
  const double calls = double(config_.micro_batches);
  const double per_call = rows / calls;
  const double lo = std::floor(per_call), frac = per_call - lo;
  double t = device_seconds(int64_t(lo), shape_, config_.train, cost_);
  if (frac > 0) {
    t = (1 - frac) * t + frac * device_seconds(int64_t(lo) + 1, shape_, config_.train, cost_);
  }
  return t * calls;
}

double PlacementPlanner::transfer_s(double rows) const {
  return transfer_seconds(rows, shape_, config_.train, cost_);
}

LayerPrediction PlacementPlanner::predict_layer(const std::vector<uint8_t>& resident_E,
                                                const std::vector<double>& rows_E) const {
  LayerPrediction p;
  double total = 0, hot = 0;
  for (size_t e = 0; e < rows_E.size(); ++e) {
    total += rows_E[e];
    if (resident_E[e]) {
      hot += rows_E[e];
      p.device_s += device_s(rows_E[e]);
      p.transfer_s += transfer_s(rows_E[e]);
    } else {
      p.host_s += host_s(rows_E[e]);
    }
  }
  p.makespan_s = std::max(p.host_s, p.device_s + p.transfer_s);
  p.hot_fraction = total > 0 ? hot / total : 0;
  return p;
}

PlanPrediction PlacementPlanner::predict(const Placement& placement,
                                         const RoutingProfile& profile) const {
  check_profile(profile);
  check_placement(placement);
  PlanPrediction out;
  double total = 0, hot = 0;
  for (int64_t l = 0; l < layers_; ++l) {
    const std::vector<double>& rows_E = profile.rows(l);
    LayerPrediction p = predict_layer(placement.resident[size_t(l)], rows_E);
    const double layer_rows = profile.total_rows(l);
    total += layer_rows;
    hot += p.hot_fraction * layer_rows;
    out.step_s += p.makespan_s;
    out.layers.push_back(p);
  }
  const int64_t n = placement.count();
  out.sync_s = double(n) * sync_seconds(shape_, config_.train, cost_);
  out.step_s += out.sync_s;
  out.hot_fraction = total > 0 ? hot / total : 0;
  out.bytes = bytes_for(n);
  return out;
}

Placement PlacementPlanner::plan(const RoutingProfile& profile) const {
  check_profile(profile);
  switch (config_.mode) {
    case PlacementMode::host: return Placement::none(layers_, experts_);
    case PlacementMode::device: return plan_device(profile);
    case PlacementMode::auto_: return plan_auto(profile);
  }
  return Placement::none(layers_, experts_);
}

Placement PlacementPlanner::plan_device(const RoutingProfile& profile) const {
  struct Candidate {
    double rows;
    int64_t layer, expert;
  };
  std::vector<Candidate> all;
  for (int64_t l = 0; l < layers_; ++l) {
    for (int64_t e = 0; e < experts_; ++e) all.push_back({profile.rows(l)[size_t(e)], l, e});
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Candidate& a, const Candidate& b) { return a.rows > b.rows; });
  Placement p = Placement::none(layers_, experts_);
  const int64_t n = capacity();
  for (int64_t i = 0; i < n; ++i) {
    p.resident[size_t(all[size_t(i)].layer)][size_t(all[size_t(i)].expert)] = 1;
  }
  return p;
}

Placement PlacementPlanner::plan_auto(const RoutingProfile& profile) const {
  Placement p = Placement::none(layers_, experts_);
  const int64_t cap = capacity();
  if (cap == 0) return p;
  const double sync = sync_seconds(shape_, config_.train, cost_);
  // Each expert's time on either side, computed once.
  std::vector<std::vector<double>> host_LE(static_cast<size_t>(layers_)),
      device_LE(static_cast<size_t>(layers_));
  for (int64_t l = 0; l < layers_; ++l) {
    for (double r : profile.rows(l)) {
      host_LE[size_t(l)].push_back(host_s(r));
      device_LE[size_t(l)].push_back(device_s(r) + transfer_s(r));
    }
  }

  // Each layer's running sums and its best next move: moving expert e off the
  // host changes only host_s, device_s and transfer_s of its own layer.
  struct LayerState {
    double host_s = 0, device_side_s = 0;  // device_side: device + transfers
    double best_gain = 0;
    int64_t best_expert = -1;
  };
  std::vector<LayerState> state(static_cast<size_t>(layers_));
  auto rescore = [&](int64_t l) {
    LayerState& s = state[size_t(l)];
    const std::vector<double>& rows_E = profile.rows(l);
    const double makespan = std::max(s.host_s, s.device_side_s);
    s.best_gain = 0;
    s.best_expert = -1;
    for (int64_t e = 0; e < experts_; ++e) {
      if (p.is_resident(l, e)) continue;
      const double r = rows_E[size_t(e)];
      const double after = std::max(s.host_s - host_LE[size_t(l)][size_t(e)],
                                    s.device_side_s + device_LE[size_t(l)][size_t(e)]);
      const double gain = makespan - after - sync;
      const bool hotter =
          s.best_expert >= 0 && gain == s.best_gain && r > rows_E[size_t(s.best_expert)];
      if (gain > s.best_gain || hotter) {
        s.best_gain = gain;
        s.best_expert = e;
      }
    }
  };
  for (int64_t l = 0; l < layers_; ++l) {
    for (double h : host_LE[size_t(l)]) state[size_t(l)].host_s += h;
    rescore(l);
  }

  for (int64_t placed = 0; placed < cap; ++placed) {
    int64_t best_layer = -1;
    for (int64_t l = 0; l < layers_; ++l) {
      const LayerState& s = state[size_t(l)];
      if (s.best_expert < 0) continue;
      if (best_layer < 0) {
        best_layer = l;
        continue;
      }
      const LayerState& b = state[size_t(best_layer)];
      const double rows_s = profile.rows(l)[size_t(s.best_expert)];
      const double rows_b = profile.rows(best_layer)[size_t(b.best_expert)];
      if (std::tie(s.best_gain, rows_s) > std::tie(b.best_gain, rows_b)) best_layer = l;
    }
    if (best_layer < 0) break;  // no move lowers the step time
    LayerState& s = state[size_t(best_layer)];
    const size_t l = size_t(best_layer), e = size_t(s.best_expert);
    p.resident[l][e] = 1;
    s.host_s -= host_LE[l][e];
    s.device_side_s += device_LE[l][e];
    rescore(best_layer);
  }
  return p;
}

std::optional<Replan> PlacementPlanner::replan(const Placement& current,
                                               const RoutingProfile& profile) const {
  check_placement(current);
  Placement best = plan(profile);
  if (best == current) return std::nullopt;
  const PlanPrediction now = predict(current, profile);
  const PlanPrediction next = predict(best, profile);

  Replan r;
  for (int64_t l = 0; l < layers_; ++l) {
    for (int64_t e = 0; e < experts_; ++e) {
      const bool was = current.is_resident(l, e), will = best.is_resident(l, e);
      r.moved_in += (!was && will) ? 1 : 0;
      r.moved_out += (was && !will) ? 1 : 0;
    }
  }
  r.bytes_moved = size_t(r.moved_in) * bytes_upload(shape_);
  r.move_s = double(r.bytes_moved) / cost_.link_bytes_per_s;
  r.gain_s_per_step = now.step_s - next.step_s;
  r.placement = std::move(best);

  const bool over_budget = now.bytes > config_.budget_bytes;
  const bool pays = r.gain_s_per_step * double(config_.horizon_steps) > r.move_s;
  const bool significant = r.gain_s_per_step >= config_.min_gain * now.step_s;
  if (over_budget || (pays && significant)) return r;
  return std::nullopt;
}

}  // namespace tiermoe
