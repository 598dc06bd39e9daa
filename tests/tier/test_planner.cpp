// The cost model's formulas and the placement planner: budgets are never
// exceeded, each mode places what it promises, and re-planning follows real
// drift but not noise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "tiermoe/core/error.h"
#include "tiermoe/core/random.h"
#include "tiermoe/tier/planner.h"

namespace tiermoe {
namespace {

ExpertShape qwen_shape(DType dtype = DType::bf16) {
  ExpertShape s;
  s.D = 2048;
  s.F = 768;
  s.dtype = dtype;
  return s;
}

// Round rates so the arithmetic below is easy to follow: the device computes
// as fast as the host, the link is free, launches cost nothing.
CostModel balanced_cost() {
  CostModel c;
  c.host_flops_per_s = 1e12;
  c.device_flops_per_s = 1e12;
  c.link_bytes_per_s = 1e30;
  c.launch_s = 0;
  c.buckets = bucket_ladder(16, 512);
  return c;
}

// An H100-class device on a PCIe link next to a 2-core host.
CostModel gpu_cost() {
  CostModel c;
  c.host_flops_per_s = 1.5e12;
  c.device_flops_per_s = 400e12;
  c.link_bytes_per_s = 25e9;
  c.launch_s = 10e-6;
  c.buckets = bucket_ladder(16, 512);
  return c;
}

size_t planner_bytes_for_one(const ExpertShape& s) {
  return bytes_workspace(s, 512) + bytes_resident(s, TrainMode::lora);
}

// A profile holding exactly these average rows per step.
RoutingProfile profile_of(const std::vector<std::vector<double>>& rows_LE) {
  nlohmann::json j = {{"format", "tiermoe-routing-profile"},
                      {"version", 1},
                      {"decay", 0.9},
                      {"steps", 1},
                      {"layers", rows_LE.size()},
                      {"experts", rows_LE[0].size()},
                      {"rows", rows_LE}};
  return RoutingProfile::from_json(j.dump(), "test profile");
}

TEST(CostModel, PaddedLaunches) {
  const std::vector<int64_t> b = bucket_ladder(16, 512);
  EXPECT_EQ(b, (std::vector<int64_t>{16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512}));
  EXPECT_EQ(bucket_ladder(16, 100), (std::vector<int64_t>{16, 24, 32, 48, 64, 96, 100}));
  EXPECT_EQ(padded_launches(0, b), (std::vector<int64_t>{}));
  EXPECT_EQ(padded_launches(1, b), (std::vector<int64_t>{16}));
  EXPECT_EQ(padded_launches(16, b), (std::vector<int64_t>{16}));
  EXPECT_EQ(padded_launches(17, b), (std::vector<int64_t>{24}));
  EXPECT_EQ(padded_launches(25, b), (std::vector<int64_t>{32}));
  EXPECT_EQ(padded_launches(512, b), (std::vector<int64_t>{512}));
  EXPECT_EQ(padded_launches(513, b), (std::vector<int64_t>{512, 16}));
  EXPECT_EQ(padded_launches(1100, b), (std::vector<int64_t>{512, 512, 96}));
}

TEST(CostModel, TimesFollowTheDocumentedFormulas) {
  const ExpertShape s = qwen_shape();
  CostModel c = gpu_cost();
  const double DF = 2048.0 * 768.0;
  EXPECT_EQ(flops_per_row(s, TrainMode::lora), 12 * DF);
  EXPECT_EQ(flops_per_row(s, TrainMode::full), 18 * DF);
  EXPECT_DOUBLE_EQ(host_seconds(100, s, TrainMode::lora, c), 100 * 12 * DF / 1.5e12);
  // 1100 rows: launches of 512, 512, 96; a forward and a backward each.
  EXPECT_DOUBLE_EQ(device_seconds(1100, s, TrainMode::full, c),
                   (512 + 512 + 96) * 18 * DF / 400e12 + 3 * 2 * 10e-6);
  EXPECT_EQ(device_seconds(0, s, TrainMode::full, c), 0);
}

TEST(CostModel, TransferBytesPerRow) {
  ExpertShape s = qwen_shape();  // bf16, absorbed scores (fp32)
  const size_t D = 2048, F = 768;
  // up: forward x + score; backward dy, h, a, score (+ x for full).
  EXPECT_EQ(row_bytes_up(s, TrainMode::lora), (D + D + 2 * F + F) * 2 + 2 * 4);
  EXPECT_EQ(row_bytes_up(s, TrainMode::full), (D + D + 2 * F + F + D) * 2 + 2 * 4);
  // down: forward y, h, a; backward dx + dscore.
  EXPECT_EQ(row_bytes_down(s, TrainMode::lora), (D + 2 * F + F + D) * 2 + 4);
  s.absorb = false;
  EXPECT_EQ(row_bytes_up(s, TrainMode::lora), (D + D + 2 * F) * 2);
  EXPECT_EQ(row_bytes_up(s, TrainMode::full), (D + D + 2 * F + F + D) * 2);
  EXPECT_EQ(row_bytes_down(s, TrainMode::full), (D + 2 * F + F + D) * 2);
  const CostModel c = gpu_cost();
  EXPECT_DOUBLE_EQ(
      transfer_seconds(10, s, TrainMode::lora, c),
      10.0 * double(row_bytes_up(s, TrainMode::lora) + row_bytes_down(s, TrainMode::lora)) / 25e9);
}

TEST(CostModel, ResidentAndSyncBytes) {
  ExpertShape s = qwen_shape();
  const size_t P = 3 * 2048 * 768;
  EXPECT_EQ(bytes_resident(s, TrainMode::lora), P * 2);
  EXPECT_EQ(bytes_resident(s, TrainMode::full), P * 2 + P * 4);  // + fp32 dW sums
  EXPECT_EQ(bytes_upload(s), P * 2);
  EXPECT_EQ(sync_bytes(s, TrainMode::lora), 0u);
  EXPECT_EQ(sync_bytes(s, TrainMode::full), P * 4 + P * 2);
  s.bias = true;
  EXPECT_EQ(bytes_resident(s, TrainMode::lora), (P + 2 * 768 + 2048) * 2);
  s = qwen_shape(DType::f64);
  EXPECT_EQ(bytes_resident(s, TrainMode::full), P * 8 + P * 8);
}

TEST(CostModel, WorkspaceSlotsAreAlignedAndDisjoint) {
  for (bool absorb : {true, false}) {
    ExpertShape s = qwen_shape();
    s.absorb = absorb;
    const int64_t G = 512;
    const WorkspaceLayout ws = workspace_layout(s, G);
    std::vector<std::string> names;
    size_t sum = 0, end = 0;
    for (const WorkspaceSlot& slot : ws.slots) {
      names.push_back(slot.name);
      EXPECT_EQ(slot.offset % kWorkspaceAlign, 0u) << slot.name;
      EXPECT_GE(slot.offset, end) << slot.name << " overlaps the slot before it";
      EXPECT_EQ(slot.bytes, size_t(shape_numel(slot.shape)) * dtype_size(slot.dtype));
      end = slot.offset + slot.bytes;
      sum += slot.bytes;
    }
    EXPECT_LE(end, ws.bytes);
    EXPECT_LT(ws.bytes, sum + ws.slots.size() * kWorkspaceAlign);
    EXPECT_EQ(size_t(kWorkspaceSets) * ws.bytes, bytes_workspace(s, G));
    std::vector<std::string> want = {"x_GD", "y_GD", "dx_GD", "h_G2F", "a_GF"};
    if (absorb) {
      want.push_back("score_G");
      want.push_back("dscore_G");
    }
    EXPECT_EQ(names, want);
    EXPECT_EQ(ws.slot("h_G2F").shape, (Shape{G, 2 * 768}));
    if (absorb) {
      EXPECT_EQ(ws.slot("score_G").dtype, DType::f32);
    } else {
      EXPECT_THROW(ws.slot("score_G"), Error);
    }
    DeviceBuffer buf{1, ws.bytes, BufferUsage::workspace};
    const DeviceTensor t = ws.tensor(buf, "a_GF");
    EXPECT_EQ(t.offset, ws.slot("a_GF").offset);
    EXPECT_EQ(t.nbytes(), ws.slot("a_GF").bytes);
  }
}

TEST(CostModel, ValidateRejectsBadRates) {
  CostModel c = gpu_cost();
  EXPECT_NO_THROW(c.validate("test"));
  c.link_bytes_per_s = 0;
  EXPECT_THROW(c.validate("test"), Error);
  c = gpu_cost();
  c.buckets = {32, 16};
  EXPECT_THROW(c.validate("test"), Error);
  c.buckets = {};
  EXPECT_THROW(c.validate("test"), Error);
  EXPECT_THROW(parse_train_mode("ful", "--mode"), Error);
  EXPECT_EQ(parse_train_mode("full", "--mode"), TrainMode::full);
}

TEST(Planner, ModesParse) {
  for (PlacementMode m : {PlacementMode::auto_, PlacementMode::host, PlacementMode::device}) {
    EXPECT_EQ(parse_placement_mode(placement_mode_name(m), "--placement"), m);
  }
  EXPECT_THROW(parse_placement_mode("gpu", "--placement"), Error);
}

TEST(Planner, AutoBalancesHostAndDeviceOnEqualRates) {
  // Four experts of 512 rows each, host and device equally fast, transfers
  // and launches free: two on each side halve the layer's time, a third on
  // the device would make the device the bottleneck.
  const ExpertShape s = qwen_shape();
  PlannerConfig cfg;
  cfg.budget_bytes = size_t(1) << 40;
  PlacementPlanner planner(cfg, s, 1, 4, balanced_cost());
  const RoutingProfile prof = profile_of({{512, 512, 512, 512}});
  const Placement p = planner.plan(prof);
  EXPECT_EQ(p.count(), 2);
  const PlanPrediction pred = planner.predict(p, prof);
  const PlanPrediction host = planner.predict(Placement::none(1, 4), prof);
  EXPECT_NEAR(pred.step_s, host.step_s / 2, 1e-12);
  EXPECT_DOUBLE_EQ(pred.hot_fraction, 0.5);
  EXPECT_DOUBLE_EQ(pred.layers[0].host_s, pred.layers[0].device_s);
  EXPECT_EQ(pred.bytes, planner.bytes_for(2));
}

TEST(Planner, HostModePlacesNothingDeviceModeFillsHottestFirst) {
  const ExpertShape s = qwen_shape();
  const RoutingProfile prof = profile_of({{5, 90, 1, 40}, {70, 0, 60, 2}});
  PlannerConfig cfg;
  cfg.mode = PlacementMode::device;
  cfg.budget_bytes = bytes_workspace(s, 512) + 3 * bytes_resident(s, TrainMode::lora) + 1;
  PlacementPlanner planner(cfg, s, 2, 4, gpu_cost());
  EXPECT_EQ(planner.capacity(), 3);
  const Placement p = planner.plan(prof);
  Placement want = Placement::none(2, 4);
  want.resident[0][1] = want.resident[1][0] = want.resident[1][2] = 1;  // 90, 70, 60
  EXPECT_EQ(p, want);

  cfg.mode = PlacementMode::host;
  EXPECT_EQ(PlacementPlanner(cfg, s, 2, 4, gpu_cost()).plan(prof), Placement::none(2, 4));
}

TEST(Planner, FastDeviceTakesTheHotExpertsSlowOneNone) {
  const ExpertShape s = qwen_shape();
  const RoutingProfile prof = RoutingProfile::synthetic(4, 32, 4096 * 8, 1.0, 3);
  PlannerConfig cfg;
  cfg.budget_bytes = size_t(1) << 40;
  PlacementPlanner fast(cfg, s, 4, 32, gpu_cost());
  const Placement p = fast.plan(prof);
  const PlanPrediction pred = fast.predict(p, prof);
  EXPECT_GT(pred.hot_fraction, 0.5);
  EXPECT_LT(pred.step_s, fast.predict(Placement::none(4, 32), prof).step_s / 2);
  // Every layer's hottest expert is resident.
  for (int64_t l = 0; l < 4; ++l) {
    const auto& rows = prof.rows(l);
    const int64_t hottest = std::max_element(rows.begin(), rows.end()) - rows.begin();
    EXPECT_TRUE(p.is_resident(l, hottest)) << "layer " << l;
  }

  CostModel slow = gpu_cost();
  slow.device_flops_per_s = 1e9;
  EXPECT_EQ(PlacementPlanner(cfg, s, 4, 32, slow).plan(prof).count(), 0);
}

TEST(Planner, BudgetIsNeverExceededAndAutoIsALocalOptimum) {
  Rng rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    ExpertShape s;
    s.D = 64 * int64_t(1 + rng.below(8));
    s.F = 32 * int64_t(1 + rng.below(8));
    s.dtype = rng.below(2) ? DType::bf16 : DType::f32;
    const int64_t L = int64_t(1 + rng.below(4)), E = int64_t(2 + rng.below(15));
    const RoutingProfile prof =
        RoutingProfile::synthetic(L, E, double(rng.below(5000)), rng.uniform(0, 2), trial);
    CostModel c = gpu_cost();
    c.host_flops_per_s = std::pow(10.0, rng.uniform(9, 13));
    c.device_flops_per_s = std::pow(10.0, rng.uniform(9, 14));
    c.link_bytes_per_s = std::pow(10.0, rng.uniform(8, 11));
    c.launch_s = rng.uniform(0, 1e-4);
    PlannerConfig cfg;
    cfg.train = rng.below(2) ? TrainMode::full : TrainMode::lora;
    cfg.micro_batches = int64_t(1 + rng.below(3));
    const size_t per = bytes_resident(s, cfg.train), ws = bytes_workspace(s, 512);
    cfg.budget_bytes = size_t(rng.uniform(0, 1.2) * double(ws + size_t(L * E) * per));
    for (PlacementMode mode : {PlacementMode::auto_, PlacementMode::device}) {
      cfg.mode = mode;
      PlacementPlanner planner(cfg, s, L, E, c);
      const Placement p = planner.plan(prof);
      const PlanPrediction pred = planner.predict(p, prof);
      ASSERT_LE(pred.bytes, cfg.budget_bytes) << "trial " << trial;
      ASSERT_EQ(pred.bytes, planner.bytes_for(p.count()));
      if (mode == PlacementMode::device) {
        ASSERT_EQ(p.count(), planner.capacity()) << "trial " << trial;
        continue;
      }
      const double host_step = planner.predict(Placement::none(L, E), prof).step_s;
      ASSERT_LE(pred.step_s, host_step * (1 + 1e-12)) << "trial " << trial;
      // No single further expert, within the budget, lowers the prediction.
      if (p.count() >= planner.capacity()) continue;
      for (int64_t l = 0; l < L; ++l) {
        for (int64_t e = 0; e < E; ++e) {
          if (p.is_resident(l, e)) continue;
          Placement q = p;
          q.resident[size_t(l)][size_t(e)] = 1;
          ASSERT_GE(planner.predict(q, prof).step_s, pred.step_s * (1 - 1e-9))
              << "trial " << trial << " layer " << l << " expert " << e;
        }
      }
    }
  }
}

TEST(Planner, ReplanFollowsDriftButNotNoise) {
  const ExpertShape s = qwen_shape();
  const int64_t L = 2, E = 32;
  PlannerConfig cfg;
  // Both layers route alike (same Zipf totals), so the 17th slot is a tie
  // between the layers' 9th-hottest experts that noise decides.
  cfg.budget_bytes = bytes_workspace(s, 512) + 17 * bytes_resident(s, TrainMode::lora);
  PlacementPlanner planner(cfg, s, L, E, gpu_cost());
  const RoutingProfile before = RoutingProfile::synthetic(L, E, 4096 * 8, 1.0, 5);
  const Placement current = planner.plan(before);
  ASSERT_EQ(current.count(), 17);
  EXPECT_FALSE(planner.replan(current, before).has_value());

  // Noise: every expert's rows move by up to 2%.
  Rng rng(9);
  int changed = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::vector<double>> rows(L);
    for (int64_t l = 0; l < L; ++l) {
      for (double r : before.rows(l)) rows[size_t(l)].push_back(r * rng.uniform(0.98, 1.02));
    }
    const RoutingProfile noisy = profile_of(rows);
    changed += planner.plan(noisy) != current;
    EXPECT_FALSE(planner.replan(current, noisy).has_value()) << "trial " << trial;
  }
  // The noise does move the best plan (the hysteresis is what holds it).
  EXPECT_GT(changed, 0);

  // Drift: the experts trade places (reversed order), so the hot set moves.
  std::vector<std::vector<double>> swapped(L);
  for (int64_t l = 0; l < L; ++l) {
    swapped[size_t(l)].assign(before.rows(l).rbegin(), before.rows(l).rend());
  }
  const RoutingProfile after = profile_of(swapped);
  const std::optional<Replan> r = planner.replan(current, after);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->placement, planner.plan(after));
  EXPECT_GT(r->moved_in, 0);
  EXPECT_GT(r->moved_out, 0);
  EXPECT_EQ(r->bytes_moved, size_t(r->moved_in) * bytes_upload(s));
  EXPECT_DOUBLE_EQ(r->move_s, double(r->bytes_moved) / 25e9);
  EXPECT_DOUBLE_EQ(r->gain_s_per_step, planner.predict(current, after).step_s -
                                           planner.predict(r->placement, after).step_s);
  EXPECT_GE(r->gain_s_per_step, cfg.min_gain * planner.predict(current, after).step_s);
}

TEST(Planner, ReplanMustPayForTheUploadOverTheHorizon) {
  // One device slot, two experts whose rows swap by a little: the move gains
  // a few rows of host time per step and costs one expert's upload.
  const ExpertShape s = qwen_shape();
  PlannerConfig cfg;
  cfg.budget_bytes = planner_bytes_for_one(s);
  PlacementPlanner planner(cfg, s, 1, 2, gpu_cost());
  const Placement current = planner.plan(profile_of({{100, 90}}));
  ASSERT_TRUE(current.is_resident(0, 0));
  const RoutingProfile after = profile_of({{90, 100}});
  const std::optional<Replan> r = planner.replan(current, after);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->moved_in, 1);
  EXPECT_EQ(r->moved_out, 1);
  const double pay_steps = r->move_s / r->gain_s_per_step;
  ASSERT_GT(pay_steps, 1.0);
  ASSERT_LT(pay_steps, double(cfg.horizon_steps));
  PlannerConfig short_cfg = cfg;
  short_cfg.horizon_steps = int64_t(std::ceil(pay_steps)) - 1;
  EXPECT_FALSE(PlacementPlanner(short_cfg, s, 1, 2, gpu_cost()).replan(current, after));
  short_cfg.horizon_steps = int64_t(std::ceil(pay_steps)) + 1;
  EXPECT_TRUE(PlacementPlanner(short_cfg, s, 1, 2, gpu_cost()).replan(current, after));
  // A larger min_gain than the move's share of the step time holds it back.
  const double share = r->gain_s_per_step / planner.predict(current, after).step_s;
  PlannerConfig strict = cfg;
  strict.min_gain = share * 1.01;
  EXPECT_FALSE(PlacementPlanner(strict, s, 1, 2, gpu_cost()).replan(current, after));
}

TEST(Planner, ShrinkBudgetForcesAPlanWithinIt) {
  const ExpertShape s = qwen_shape();
  const int64_t L = 3, E = 16;
  PlannerConfig cfg;
  cfg.mode = PlacementMode::device;
  cfg.train = TrainMode::full;
  cfg.budget_bytes = size_t(1) << 40;
  PlacementPlanner planner(cfg, s, L, E, gpu_cost());
  const RoutingProfile prof = RoutingProfile::synthetic(L, E, 8192, 1.0, 2);
  const Placement big = planner.plan(prof);
  EXPECT_EQ(big.count(), L * E);

  const size_t smaller = planner.bytes_for(5) + bytes_resident(s, TrainMode::full) / 2;
  planner.shrink_budget(smaller);
  EXPECT_EQ(planner.budget(), smaller);
  planner.shrink_budget(size_t(1) << 41);  // never grows
  EXPECT_EQ(planner.budget(), smaller);
  const std::optional<Replan> r = planner.replan(big, prof);
  ASSERT_TRUE(r.has_value()) << "a placement over the budget must be replaced";
  EXPECT_EQ(r->placement.count(), 5);
  EXPECT_LE(planner.predict(r->placement, prof).bytes, smaller);
  EXPECT_EQ(r->moved_in, 0);
  EXPECT_EQ(r->moved_out, L * E - 5);

  planner.shrink_budget(bytes_workspace(s, 512));  // not even one expert
  EXPECT_EQ(planner.capacity(), 0);
  EXPECT_EQ(planner.plan(prof).count(), 0);
}

TEST(Planner, RejectsMismatchedShapes) {
  PlannerConfig cfg;
  cfg.budget_bytes = 1 << 30;
  PlacementPlanner planner(cfg, qwen_shape(), 2, 8, gpu_cost());
  EXPECT_THROW(planner.plan(RoutingProfile(3, 8)), Error);
  EXPECT_THROW(planner.plan(RoutingProfile(2, 4)), Error);
  EXPECT_THROW(planner.predict(Placement::none(2, 7), RoutingProfile(2, 8)), Error);
  cfg.min_gain = 1.5;
  EXPECT_THROW(PlacementPlanner(cfg, qwen_shape(), 2, 8, gpu_cost()), Error);
  cfg.min_gain = 0.05;
  cfg.horizon_steps = 0;
  EXPECT_THROW(PlacementPlanner(cfg, qwen_shape(), 2, 8, gpu_cost()), Error);
}

TEST(Planner, FractionalRowsInterpolateDeviceTime) {
  // 0.25 rows on average: a quarter of a 16-row launch pair.
  const ExpertShape s = qwen_shape();
  PlannerConfig cfg;
  cfg.mode = PlacementMode::device;
  cfg.budget_bytes = size_t(1) << 40;
  PlacementPlanner planner(cfg, s, 1, 1, gpu_cost());
  RoutingProfile prof(1, 1, 0.75);
  prof.observe(0, {1});
  prof.end_step();
  prof.end_step();  // 0.75 rows
  const PlanPrediction pred = planner.predict(planner.plan(prof), prof);
  EXPECT_NEAR(pred.layers[0].device_s, 0.75 * device_seconds(1, s, TrainMode::lora, gpu_cost()),
              1e-18);
}

}  // namespace
}  // namespace tiermoe
