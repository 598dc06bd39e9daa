// SavedTensorsReport: its totals equal the MemoryTracker's saved bytes, per
// region it lists what the policy keeps, and it renders as a table and JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "remat/remat_rig.h"
#include "tiermoe/remat/report.h"

namespace tiermoe {
namespace {

using testing::LayerRig;
using testing::Variant;

// Everything a forward keeps -- the router's outputs, the plan's scores, the
// experts' activations -- is counted under MemTag::saved; the report over the
// live forwards must add up to exactly that. The process tracker is the one
// that sees all of them (the router allocates its outputs there).
TEST(SavedTensorsReport, TotalsEqualTheTrackersSavedBytes) {
  MemoryTracker& mem = MemoryTracker::process();
  for (const char* p : {"none", "full", "default", "save-w2-only", "save:w13,w2"}) {
    for (AbsorbScores a : {AbsorbScores::on, AbsorbScores::off}) {
      for (bool wg : {true, false}) {
        SCOPED_TRACE(std::string(p) + " absorb " + std::string(absorb_scores_name(a)) +
                     " weight_grads " + std::to_string(wg));
        LayerRig rig(RouterKind::softmax_topk, Variant::swiglu, DType::bf16, 5);
        PaddedDispatcher disp = PaddedDispatcher::to_multiple(4);
        MoeLayer layer = testing::remat_layer(rig, a, disp, RematPolicy::parse(p));
        Tensor x1 = rig.x_TD.clone(), x2 = rig.x_TD.clone();  // fresh: not yet tagged saved
        const size_t before = mem.live(MemTag::saved);
        MoeSaved s1, s2;
        layer.forward(x1, s1, wg);
        layer.forward(x2, s2, wg);
        SavedTensorsReport report(p);
        report.add_moe_layer("layers.0.mlp", s1);
        report.add_moe_layer("layers.1.mlp", s2);
        EXPECT_EQ(report.bytes(), mem.live(MemTag::saved) - before);
        EXPECT_EQ(report.bytes("layers.0.mlp"), s1.bytes());
        EXPECT_EQ(report.bytes("layers.0.mlp") + report.bytes("layers.1.mlp"), report.bytes());
        EXPECT_EQ(report.index_bytes(), 2 * report.index_bytes("layers.1.mlp"));
      }
    }
  }
}

// Per region, what the policy keeps (bf16 rig: D 6, F 5; local dispatch, so
// N = T * K rows).
TEST(SavedTensorsReport, RegionsHoldWhatThePolicyKeeps) {
  LayerRig rig(RouterKind::softmax_topk, Variant::swiglu, DType::bf16, 5);
  LocalDispatcher disp;
  const size_t N = LayerRig::T * LayerRig::K, D = LayerRig::D, F = LayerRig::F;
  struct Case {
    const char* policy;
    AbsorbScores absorb;
    size_t dispatch, w13, act, w2, combine;  // tracked bytes per region
  };
  for (const Case& c : {
           Case{"none", AbsorbScores::on, N * D * 2, N * 2 * F * 2, N * F * 2, N * 4, 0},
           Case{"none", AbsorbScores::off, N * D * 2, N * 2 * F * 2, N * F * 2, 0,
                N * 4 + N * D * 2},
           Case{"default", AbsorbScores::on, 0, N * 2 * F * 2, N * F * 2, N * 4, 0},
           Case{"full", AbsorbScores::on, 0, 0, 0, N * 4, 0},
           Case{"full", AbsorbScores::off, 0, 0, 0, 0, N * 4 + N * D * 2},
           Case{"save-w2-only", AbsorbScores::on, 0, 0, 0, N * 4, 0},
       }) {
    SCOPED_TRACE(std::string(c.policy) + " absorb " + std::string(absorb_scores_name(c.absorb)));
    MoeLayer layer = testing::remat_layer(rig, c.absorb, disp, RematPolicy::parse(c.policy));
    MoeSaved saved;
    layer.forward(rig.x_TD, saved, /*weight_grads=*/true);
    SavedTensorsReport r(c.policy);
    r.add_moe_layer("moe", saved);
    EXPECT_EQ(r.region_bytes("moe", "dispatch"), c.dispatch);
    EXPECT_EQ(r.region_bytes("moe", "w13"), c.w13);
    EXPECT_EQ(r.region_bytes("moe", "act"), c.act);
    EXPECT_EQ(r.region_bytes("moe", "w2"), c.w2);
    EXPECT_EQ(r.region_bytes("moe", "combine"), c.combine);
    // The router keeps x_TD (bf16), logits and probs (fp32 [T, E]), weights (fp32 [T, K]).
    const size_t T = LayerRig::T, E = LayerRig::E, K = LayerRig::K;
    EXPECT_EQ(r.region_bytes("moe", "router"), T * D * 2 + 2 * T * E * 4 + T * K * 4);
  }
}

TEST(SavedTensorsReport, TableAndJson) {
  LayerRig rig(RouterKind::softmax_topk, Variant::swiglu, DType::f32, 5);
  LocalDispatcher disp;
  MoeLayer layer = testing::remat_layer(rig, AbsorbScores::on, disp, RematPolicy::parse("default"));
  MoeSaved saved;
  layer.forward(rig.x_TD, saved);
  SavedTensorsReport r("default");
  r.add_moe_layer("moe", saved);

  const std::string table = r.to_table();
  for (const char* want : {"remat policy: default", "moe.w13", "h_N2F", "moe.combine", "row_TK",
                           "(plan index, host)", "run"}) {
    EXPECT_NE(table.find(want), std::string::npos) << want << "\n" << table;
  }
  EXPECT_EQ(table.find("x_ND"), std::string::npos) << "default replays dispatch\n" << table;
  EXPECT_EQ(table.find(" \n"), std::string::npos) << "trailing blanks\n" << table;

  nlohmann::json j = nlohmann::json::parse(r.to_json());
  EXPECT_EQ(j["policy"], "default");
  EXPECT_EQ(j["bytes"].get<size_t>(), saved.bytes());
  ASSERT_EQ(j["layers"].size(), 1u);
  const auto& layer_json = j["layers"][0];
  EXPECT_EQ(layer_json["name"], "moe");
  size_t sum = 0, tensors = 0;
  for (const auto& region : layer_json["regions"]) {
    size_t region_sum = 0;
    for (const auto& t : region["tensors"]) {
      if (t["tracked"].get<bool>()) region_sum += t["bytes"].get<size_t>();
      ++tensors;
    }
    EXPECT_EQ(region["bytes"].get<size_t>(), region_sum) << region["name"];
    sum += region_sum;
  }
  EXPECT_EQ(sum, saved.bytes());
  EXPECT_EQ(tensors, r.rows().size());
  const auto& w13 = layer_json["regions"][2];
  EXPECT_EQ(w13["name"], "moe.w13");
  EXPECT_EQ(w13["tensors"][0]["name"], "h_N2F");
  EXPECT_EQ(w13["tensors"][0]["dtype"], "f32");
  EXPECT_EQ(w13["tensors"][0]["shape"], nlohmann::json::array({LayerRig::T * LayerRig::K,
                                                               2 * LayerRig::F}));
}

TEST(SavedTensorsReport, FormatBytes) {
  EXPECT_EQ(format_bytes(96), "96 B");
  EXPECT_EQ(format_bytes(4096), "4.0 KiB");
  EXPECT_EQ(format_bytes(134217728), "128.0 MiB");
}

}  // namespace
}  // namespace tiermoe
