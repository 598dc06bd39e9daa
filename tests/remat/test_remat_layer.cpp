// Remat on one MoE layer: per-region replay counts per policy, the combine's
// body once per forward, bitwise-equal loss and gradients under every policy,
// and the W2 output freed after the forward when scores are absorbed.
#include <gtest/gtest.h>

#include "remat/remat_rig.h"

namespace tiermoe {
namespace {

using testing::LayerRig;
using testing::Variant;

constexpr AbsorbScores kOn = AbsorbScores::on, kOff = AbsorbScores::off;

// Replays per backward, by region, written out by hand from what each
// backward reads (moe/regions.h): dW13 reads x_ND; the activation backward
// h_N2F; dW2 and the absorbed d score a_NF; a post-expert norm W2's output.
struct ReplayCase {
  const char* policy;
  Variant variant;
  AbsorbScores absorb;
  bool weight_grads;
  int dispatch, w13, act, w2;
};
const ReplayCase kReplayCases[] = {
    // policy          variant                 absorb wg     disp w13 act w2
    {"none",           Variant::swiglu,        kOn,  true,  0, 0, 0, 0},
    {"none",           Variant::post_norm,     kOff, true,  0, 0, 0, 0},
    {"full",           Variant::swiglu,        kOn,  true,  1, 1, 1, 0},
    {"full",           Variant::swiglu,        kOn,  false, 1, 1, 1, 0},
    {"full",           Variant::swiglu,        kOff, true,  1, 1, 1, 0},
    {"full",           Variant::swiglu,        kOff, false, 1, 1, 0, 0},  // nothing reads a_NF
    {"full",           Variant::post_norm,     kOff, true,  1, 1, 1, 1},
    {"full",           Variant::post_norm,     kOff, false, 1, 1, 1, 1},  // w2 replay reads a
    {"default",        Variant::swiglu,        kOn,  true,  1, 0, 0, 0},
    {"default",        Variant::swiglu,        kOn,  false, 0, 0, 0, 0},
    {"default",        Variant::swiglu,        kOff, true,  1, 0, 0, 0},
    {"default",        Variant::post_norm,     kOff, false, 0, 0, 0, 0},
    {"save-w2-only",   Variant::swiglu,        kOn,  true,  1, 1, 1, 0},
    {"save-w2-only",   Variant::swiglu,        kOff, false, 1, 1, 0, 0},
    {"save-w2-only",   Variant::post_norm,     kOff, true,  1, 1, 1, 0},
    {"save-w2-only",   Variant::post_norm,     kOff, false, 1, 1, 0, 0},
    {"save:w13,w2",    Variant::swiglu,        kOn,  true,  1, 0, 1, 0},
    {"save:w13,w2",    Variant::swiglu,        kOn,  false, 0, 0, 1, 0},
    {"save:w13,w2",    Variant::swiglu,        kOff, false, 0, 0, 0, 0},
    {"save:w13,w2",    Variant::post_norm,     kOff, true,  1, 0, 1, 0},
    {"save:dispatch",  Variant::swiglu,        kOn,  true,  0, 1, 1, 0},
    {"save:dispatch",  Variant::swiglu,        kOff, false, 0, 1, 0, 0},
    {"save:act",       Variant::swiglu,        kOn,  false, 1, 1, 0, 0},
    {"save:act",       Variant::post_norm,     kOff, false, 1, 1, 0, 1},
};

TEST(RematLayer, ReplayCountsPerRegionFollowThePolicy) {
  for (const ReplayCase& c : kReplayCases) {
    SCOPED_TRACE(std::string(c.policy) + " " + testing::variant_name(c.variant) + " absorb " +
                 std::string(absorb_scores_name(c.absorb)) + " weight_grads " +
                 std::to_string(c.weight_grads));
    LayerRig rig(RouterKind::softmax_topk, c.variant, DType::f32, 7);
    PaddedDispatcher disp = PaddedDispatcher::to_multiple(4);
    MoeLayer layer = testing::remat_layer(rig, c.absorb, disp, RematPolicy::parse(c.policy));
    MoeSaved saved;
    Tensor out = layer.forward(rig.x_TD, saved, c.weight_grads);
    Tensor dx = Tensor::empty(rig.x_TD.shape(), DType::f32);
    // Two backwards from one forward: each replays on its own, and neither
    // runs the combine's body again.
    for (int pass = 1; pass <= 2; ++pass) {
      layer.backward(dx, rig.P_TD, saved);
      const MoeRegionCounters& n = layer.counters();
      EXPECT_EQ(n.replay_count(MoeRegion::dispatch), pass * c.dispatch) << "pass " << pass;
      EXPECT_EQ(n.replay_count(MoeRegion::w13), pass * c.w13) << "pass " << pass;
      EXPECT_EQ(n.replay_count(MoeRegion::act), pass * c.act) << "pass " << pass;
      EXPECT_EQ(n.replay_count(MoeRegion::w2), pass * c.w2) << "pass " << pass;
      EXPECT_EQ(n.run_count(MoeRegion::w2), 1 + pass * c.w2) << "pass " << pass;
      EXPECT_EQ(n.run_count(MoeRegion::combine), 1) << "pass " << pass;
      EXPECT_EQ(n.replay_count(MoeRegion::combine), 0);
      EXPECT_EQ(n.run_count(MoeRegion::router), 1);
      EXPECT_EQ(n.replay_count(MoeRegion::router), 0);
    }
    // The plan the layer used says the same as the counters.
    for (MoeRegion r : {MoeRegion::dispatch, MoeRegion::w13, MoeRegion::act, MoeRegion::w2}) {
      EXPECT_EQ(saved.remat.replays(r), layer.counters().replay_count(r) > 0)
          << moe_region_name(r);
    }
    layer.forward(rig.x_TD, saved, c.weight_grads);
    EXPECT_EQ(layer.counters().run_count(MoeRegion::combine), 2);
  }
}

// Loss, output and every gradient (x, router, experts, biases, norms) under each policy equal the run without remat, bit for bit.
TEST(RematLayer, EveryPolicyIsBitwiseEqualToNoRemat) {
  const char* policies[] = {"full",          "default",  "save-w2-only", "save:w13,w2",
                            "save:dispatch", "save:act", "save:dispatch,w13"};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (Variant v : {Variant::swiglu, Variant::gpt_oss_bias, Variant::post_norm}) {
      RouterKind kind = v == Variant::gpt_oss_bias ? RouterKind::gpt_oss : RouterKind::softmax_topk;
      LayerRig rig(kind, v, dt, 29);
      PaddedDispatcher disp = PaddedDispatcher::to_ladder({2, 4, 8});
      for (AbsorbScores a : {AbsorbScores::automatic, kOff}) {
        for (bool wg : {true, false}) {
          MoeLayer plain = testing::remat_layer(rig, a, disp, RematPolicy::none());
          const auto want = rig.run(plain, wg);
          for (const char* p : policies) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " " + testing::variant_name(v) +
                         " absorb " + std::string(absorb_scores_name(a)) + " weight_grads " +
                         std::to_string(wg) + " policy " + p);
            MoeLayer layer = testing::remat_layer(rig, a, disp, RematPolicy::parse(p));
            EXPECT_TRUE(testing::all_results_bitwise(rig.run(layer, wg), want));
          }
        }
      }
    }
  }
}

// With absorbed scores the W2 output has no backward reader: whether or not
// w2 is saved, forward frees y_ND (N x D) before it returns, and the only
// activation left is the layer output. Post-combine keeps it, as saved.
TEST(RematLayer, AbsorbedW2OutputIsFreedAfterTheForward) {
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const char* p : {"save-w2-only", "save:w13,w2", "none", "default"}) {
      for (AbsorbScores a : {kOn, kOff}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + p + " absorb " +
                     std::string(absorb_scores_name(a)));
        LayerRig rig(RouterKind::softmax_topk, Variant::swiglu, dt, 11);
        LocalDispatcher disp;
        MemoryTracker tracker;
        MoeLayer layer = testing::remat_layer(rig, a, disp, RematPolicy::parse(p), &tracker);
        MoeSaved saved;
        Tensor out = layer.forward(rig.x_TD, saved, /*weight_grads=*/true);
        const size_t y_bytes = size_t(saved.plan.N * LayerRig::D) * dtype_size(dt);
        // It existed during the forward ...
        EXPECT_GE(tracker.peak(MemTag::activations), out.nbytes() + y_bytes);
        // ... and only the output outlives it as an activation.
        EXPECT_EQ(tracker.live(MemTag::activations), out.nbytes());
        EXPECT_EQ(saved.layer.has("y_ND"), a == kOff);
        // What the layer's tracker holds as saved: the experts' kept tensors,
        // plus y_ND when post-combine (the routing tensors are the router's).
        const size_t want = saved.routed[0].bytes() + (a == kOff ? y_bytes : 0);
        EXPECT_EQ(tracker.live(MemTag::saved), want);
        EXPECT_EQ(tracker.live_total(), out.nbytes() + want);
      }
    }
  }
}

}  // namespace
}  // namespace tiermoe
