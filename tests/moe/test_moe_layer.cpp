// The MoE layer as a whole: finite differences, the reference loop, retained
// bytes, dx-only mode and configuration errors.
#include "moe/moe_layer_rig.h"
#include "tiermoe/moe/moe_ref.h"

namespace tiermoe {
namespace {

using testing::LayerRig;
using testing::Variant;

// d loss / d every parameter and x of the whole layer (route, dispatch,
// compute, combine) against f64 central differences.
void check_layer_fd(RouterKind kind, Variant v, AbsorbScores absorb) {
  SCOPED_TRACE(std::string(router_kind_name(kind)) + " " + testing::variant_name(v) + " " +
               std::string(absorb_scores_name(absorb)));
  LayerRig rig(kind, v, DType::f64, 41);
  PaddedDispatcher disp = PaddedDispatcher::to_multiple(4);
  MoeLayer layer = rig.layer(absorb, disp);
  auto loss = [&]() {
    MoeSaved s;
    return testing::projected_loss(layer.forward(rig.x_TD, s), rig.P_TD);
  };
  auto got = rig.run(layer);
  EXPECT_TRUE(testing::fd_check(loss, rig.x_TD, got.at("dx"), "dx", 1e-6, 1e-8, 40));
  for (const auto& n : rig.router->param_names()) {
    if (rig.router->has_grad(n)) {
      EXPECT_TRUE(testing::fd_check(loss, rig.router->param(n), got.at("router." + n), "router." + n,
                                    1e-6, 1e-8, 40));
    }
  }
  for (const auto& n : rig.experts->param_names()) {
    EXPECT_TRUE(testing::fd_check(loss, rig.experts->param(n), got.at("experts." + n),
                                  "experts." + n, 1e-6, 1e-8, 40));
  }
}

TEST(MoeLayer, GradientsMatchFiniteDifferences) {
  check_layer_fd(RouterKind::softmax_topk, Variant::swiglu, AbsorbScores::on);
  check_layer_fd(RouterKind::softmax_topk, Variant::swiglu, AbsorbScores::off);
  check_layer_fd(RouterKind::gpt_oss, Variant::gpt_oss_bias, AbsorbScores::on);
  check_layer_fd(RouterKind::deepseek_v3, Variant::swiglu, AbsorbScores::on);
  check_layer_fd(RouterKind::deepseek_v2, Variant::swiglu, AbsorbScores::off);
  check_layer_fd(RouterKind::softmax_topk, Variant::post_norm, AbsorbScores::automatic);
}

// The grouped layer against Hugging Face's per-token loop.
TEST(MoeLayer, MatchesTheReferenceLoop) {
  struct Case {
    DType dt;
    double rtol;  // relative to the output's scale
  };
  // f32: both accumulate in f32 in different orders (~1e-6 relative).
  // bf16: both round h, a, y to bf16; a GEMM summing in another order can
  // flip one rounding by 1 bf16 ulp (2^-8), which then propagates.
  for (Case c : {Case{DType::f64, 1e-12}, Case{DType::f32, 1e-5}, Case{DType::bf16, 3e-2}}) {
    for (Variant v : {Variant::swiglu, Variant::gpt_oss_bias, Variant::post_norm}) {
      for (AbsorbScores a : {AbsorbScores::automatic, AbsorbScores::off}) {
        RouterKind kind = v == Variant::gpt_oss_bias ? RouterKind::gpt_oss : RouterKind::softmax_topk;
        LayerRig rig(kind, v, c.dt, 53);
        LocalDispatcher disp;
        MoeLayer layer = rig.layer(a, disp);
        MoeSaved saved;
        Tensor out = layer.forward(rig.x_TD, saved);
        Tensor want = Tensor::empty(out.shape(), c.dt);
        moe_ref_forward(want, rig.x_TD, saved.routing.ids_TK, saved.routing.weights_TK,
                        *rig.experts);
        EXPECT_TRUE(testing::close_scaled(out, want, c.rtol,
                                          std::string(dtype_name(c.dt)) + " " +
                                              testing::variant_name(v) + " absorb " +
                                              std::string(absorb_scores_name(a))));
      }
    }
  }
}

// With absorbed scores the W2 output y_ND is not kept; everything else is
// the same, so the saved bytes differ by exactly N x D x sizeof(dtype) --
// except without weight grads, where post-combine needs no a_NF either (only
// dW2 and the absorbed d score read it) and so keeps N x F fewer values.
TEST(MoeLayer, AbsorptionSavesExactlyTheW2Output) {
  for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
    for (bool weight_grads : {true, false}) {
      LayerRig rig(RouterKind::softmax_topk, Variant::swiglu, dt, 61);
      PaddedDispatcher disp = PaddedDispatcher::to_ladder({4, 8});
      size_t saved_bytes[2] = {0, 0};
      int64_t N = 0;
      for (AbsorbScores a : {AbsorbScores::on, AbsorbScores::off}) {
        MemoryTracker tracker;
        MoeLayer layer = rig.layer(a, disp, nullptr, &tracker);
        MoeSaved saved;
        layer.forward(rig.x_TD, saved, weight_grads);
        N = saved.plan.N;
        saved_bytes[a == AbsorbScores::off] = tracker.live(MemTag::saved);
        EXPECT_EQ(saved.layer.has("y_ND"), a == AbsorbScores::off);
        EXPECT_EQ(saved.routed[0].has("x_ND"), weight_grads);
        EXPECT_TRUE(saved.routed[0].has("h_N2F"));
        EXPECT_EQ(saved.routed[0].has("a_NF"), weight_grads || a == AbsorbScores::on);
        saved.clear();
        EXPECT_EQ(tracker.live(MemTag::saved), 0u) << "saved tensors outlived their record";
      }
      const int64_t values = N * LayerRig::D - (weight_grads ? 0 : N * LayerRig::F);
      EXPECT_EQ(saved_bytes[1] - saved_bytes[0], size_t(values) * dtype_size(dt))
          << dtype_name(dt) << " weight_grads " << weight_grads;
    }
  }
}

TEST(MoeLayer, SavedItemsNameEveryTensorByRegionOnce) {
  LayerRig rig(RouterKind::softmax_topk, Variant::swiglu, DType::f32, 3);
  LocalDispatcher disp;
  MoeLayer layer = rig.layer(AbsorbScores::automatic, disp);
  MoeSaved saved;
  layer.forward(rig.x_TD, saved);
  size_t tracked = 0, index_bytes = 0;
  std::vector<std::string> names;
  for (const auto& item : saved.items()) {
    names.push_back(std::string(moe_region_name(item.region)) + "." + item.name);
    (item.tracked ? tracked : index_bytes) += item.bytes;
  }
  EXPECT_EQ(tracked, saved.bytes());
  // The plan's index arrays: token_N, slot_N (i32, N), count_E, offset_E,
  // row_TK (i64).
  const size_t N = size_t(saved.plan.N), E = size_t(LayerRig::E);
  EXPECT_EQ(index_bytes, 2 * N * 4 + (2 * E + 1) * 8 + N * 8);
  for (const char* want : {"router.x_TD", "router.weights_TK", "dispatch.x_ND", "w13.h_N2F",
                           "act.a_NF", "w2.score_N", "combine.row_TK"}) {
    EXPECT_EQ(std::count(names.begin(), names.end(), want), 1) << want;
  }
  EXPECT_EQ(std::count(names.begin(), names.end(), "combine.y_ND"), 0);
}

// Frozen experts (LoRA): forward keeps no x_ND, backward gives the same dx
// and leaves the expert grads alone.
TEST(MoeLayer, DxOnlyModeGivesTheSameDx) {
  LayerRig rig(RouterKind::softmax_topk, Variant::gpt_oss_bias, DType::f64, 71);
  LocalDispatcher disp;
  MoeLayer layer = rig.layer(AbsorbScores::on, disp);
  auto full = rig.run(layer, true);
  auto lean = rig.run(layer, false);
  EXPECT_TRUE(testing::bitwise_equal(lean.at("dx"), full.at("dx"), "dx"));
  EXPECT_TRUE(testing::bitwise_equal(lean.at("out"), full.at("out"), "out"));
  for (const auto& n : rig.experts->param_names()) {
    EXPECT_EQ(testing::max_abs(lean.at("experts." + n)), 0.0) << n;
    EXPECT_GT(testing::max_abs(full.at("experts." + n)), 0.0) << n;
  }
}

// A fixed routing (no router) through the same layer: the stub seam. d
// weights_TK comes back to the caller and matches finite differences.
TEST(MoeLayer, FixedRoutingReturnsWeightGradients) {
  const int64_t T = 9, K = 3, E = 5, D = 4, F = 3;
  Rng rng(83);
  GroupedExperts ex(testing::experts_config(Variant::swiglu, E, D, F), DType::f64);
  testing::fill_experts(ex, rng);
  HostExperts host(ex);
  Routing r = testing::fixed_routing(T, K, E, DType::f64, rng);
  Tensor x = testing::random_tensor({T, D}, DType::f64, rng);
  Tensor P = testing::random_tensor({T, D}, DType::f64, rng);
  LocalDispatcher disp;
  for (AbsorbScores a : {AbsorbScores::on, AbsorbScores::off}) {
    MoeLayerConfig lc;
    lc.absorb_scores = a;
    MoeLayer layer(lc, nullptr, disp, host);
    auto loss = [&]() {
      MoeSaved s;
      return testing::projected_loss(layer.forward(x, testing::copy_routing(r), s), P);
    };
    MoeSaved saved;
    layer.forward(x, testing::copy_routing(r), saved);
    Tensor dx = Tensor::empty({T, D}, DType::f64);
    Tensor dw = layer.backward(dx, P, saved);
    EXPECT_TRUE(testing::fd_check(loss, r.weights_TK, dw, "dweights_TK"));
    EXPECT_TRUE(testing::fd_check(loss, x, dx, "dx"));
    EXPECT_THROW(layer.forward(x, saved), Error);  // no router to route with
  }
}

TEST(MoeLayer, BadConfigurationIsAClearError) {
  LayerRig normed(RouterKind::softmax_topk, Variant::post_norm, DType::f32, 1);
  LocalDispatcher disp;
  // on + an output postprocess: the error says why.
  try {
    normed.layer(AbsorbScores::on, disp);
    ADD_FAILURE() << "absorb on with a postprocess was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scale-invariant"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(normed.layer(AbsorbScores::automatic, disp).absorbs_scores());
  LayerRig plain(RouterKind::softmax_topk, Variant::swiglu, DType::f32, 1);
  EXPECT_TRUE(plain.layer(AbsorbScores::automatic, disp).absorbs_scores());
  EXPECT_THROW(parse_absorb_scores("sometimes"), Error);
  EXPECT_EQ(parse_absorb_scores("off"), AbsorbScores::off);

  // K > E, as a router config and as a routing handed to the layer.
  RouterConfig rc = testing::router_config(RouterKind::softmax_topk, 6, 8, 9);
  EXPECT_THROW(Router(rc, DType::f32), Error);
  Rng rng(2);
  Routing too_many = testing::fixed_routing(LayerRig::T, 2, 8, DType::f32, rng);
  too_many.K = 9;
  MoeLayer fixed(MoeLayerConfig{}, nullptr, disp, *plain.host);
  MoeSaved saved;
  EXPECT_THROW(fixed.forward(plain.x_TD, too_many, saved), Error);

  // Router and experts that disagree on E, or on the dtype.
  Router other_e(testing::router_config(RouterKind::softmax_topk, 6, 4, 2), DType::f32);
  EXPECT_THROW(MoeLayer(MoeLayerConfig{}, &other_e, disp, *plain.host), Error);
  Router other_dt(testing::router_config(RouterKind::softmax_topk, 6, 8, 2), DType::f64);
  EXPECT_THROW(MoeLayer(MoeLayerConfig{}, &other_dt, disp, *plain.host), Error);
  // Wrong input width or dtype.
  MoeLayer layer = plain.layer(AbsorbScores::automatic, disp);
  EXPECT_THROW(layer.forward(Tensor::zeros({3, 5}, DType::f32), saved), Error);
  EXPECT_THROW(layer.forward(Tensor::zeros({3, 6}, DType::f64), saved), Error);
  // Backward before forward.
  MoeSaved empty;
  Tensor dx = Tensor::empty({3, 6}, DType::f32);
  EXPECT_THROW(layer.backward(dx, Tensor::zeros({3, 6}, DType::f32), empty), Error);
}

}  // namespace
}  // namespace tiermoe
