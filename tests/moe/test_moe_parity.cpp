// Absorbed == post-combine (f64, rtol 1e-12) for every dispatcher x router x
// expert variant: the output, a scalar loss and every gradient. With rounding
// gone both paths compute the same function, so a dropped, doubled or
// misaligned score is an O(1) error -- and the suite proves the comparison
// catches exactly that, with a deliberately broken absorbed path.
#include <memory>
#include <tuple>

#include "moe/moe_layer_rig.h"

namespace tiermoe {
namespace {

using testing::LayerRig;
using testing::Variant;

constexpr double kParityRtol = 1e-12;

std::shared_ptr<Dispatcher> make_dispatcher(int which) {
  if (which == 0) return std::make_shared<LocalDispatcher>();
  if (which == 1) return std::make_shared<PaddedDispatcher>(PaddedDispatcher::to_multiple(4));
  return std::make_shared<PaddedDispatcher>(PaddedDispatcher::to_ladder({2, 4, 8}));
}
const char* dispatcher_label(int which) {
  return which == 0 ? "local" : which == 1 ? "padded_multiple" : "padded_ladder";
}

// A test-local executor that corrupts the absorbed scores on their way to the
// experts: applied twice (s * s) or shifted by one row.
class BrokenScores final : public ExpertExecutor {
 public:
  enum class Fault { doubled, shifted };
  BrokenScores(ExpertExecutor& inner, Fault fault) : inner_(&inner), fault_(fault) {}
  std::string name() const override { return "broken"; }
  int64_t num_experts() const override { return inner_->num_experts(); }
  int64_t hidden() const override { return inner_->hidden(); }
  DType dtype() const override { return inner_->dtype(); }
  bool has_output_postprocess() const override { return inner_->has_output_postprocess(); }
  void forward(Tensor& y, const Tensor& x, const std::vector<int64_t>& off, const Tensor& s,
               SavedTensors& saved, const ExpertSaves& keep) override {
    inner_->forward(y, x, off, corrupt(s), saved, keep);
  }
  void replay(SavedTensors& saved, const Tensor& x, const std::vector<int64_t>& off,
              const Tensor& s, const ExpertStages& stages) override {
    inner_->replay(saved, x, off, corrupt(s), stages);
  }
  void backward(Tensor& dx, Tensor& ds, const Tensor& dy, const std::vector<int64_t>& off,
                const Tensor& s, const SavedTensors& saved, bool wg, bool ag) override {
    inner_->backward(dx, ds, dy, off, corrupt(s), saved, wg, ag);
  }

 private:
  Tensor corrupt(const Tensor& s) const {
    if (!s.defined()) return s;
    Tensor c = s.clone();
    const int64_t N = s.numel();
    for (int64_t n = 0; n < N; ++n) {
      c.set(n, fault_ == Fault::doubled ? s.get(n) * s.get(n) : s.get((n + 1) % N));
    }
    return c;
  }
  ExpertExecutor* inner_;
  Fault fault_;
};

class AbsorbParity
    : public ::testing::TestWithParam<std::tuple<int, RouterKind, Variant>> {};

TEST_P(AbsorbParity, AbsorbedMatchesPostCombineAndTheTestBites) {
  const auto [which, kind, variant] = GetParam();
  auto disp = make_dispatcher(which);
  LayerRig rig(kind, variant, DType::f64, 17);
  MoeLayer absorbed = rig.layer(AbsorbScores::on, *disp);
  MoeLayer post = rig.layer(AbsorbScores::off, *disp);
  ASSERT_TRUE(absorbed.absorbs_scores());
  ASSERT_FALSE(post.absorbs_scores());
  auto want = rig.run(post);
  auto got = rig.run(absorbed);
  EXPECT_TRUE(testing::all_results_close(got, want, kParityRtol));
  EXPECT_GT(testing::max_abs(want.at("router.weight")), 0.0);  // the routers do get gradient

  for (auto fault : {BrokenScores::Fault::doubled, BrokenScores::Fault::shifted}) {
    BrokenScores broken(*rig.host, fault);
    MoeLayer bad = rig.layer(AbsorbScores::on, *disp, &broken);
    EXPECT_FALSE(testing::all_results_close(rig.run(bad), want, kParityRtol))
        << "the parity comparison did not catch a "
        << (fault == BrokenScores::Fault::doubled ? "doubled" : "shifted") << " score";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllPaths, AbsorbParity,
    ::testing::Combine(::testing::Values(0, 1, 2),
                       ::testing::Values(RouterKind::softmax_topk, RouterKind::deepseek_v3,
                                         RouterKind::deepseek_v2, RouterKind::gpt_oss),
                       ::testing::Values(Variant::swiglu, Variant::gpt_oss_bias)),
    [](const auto& info) {
      return std::string(dispatcher_label(std::get<0>(info.param))) + "_" +
             std::string(router_kind_name(std::get<1>(info.param))) + "_" +
             testing::variant_name(std::get<2>(info.param));
    });

// Local and padded dispatch give bitwise equal outputs and gradients: rows are
// computed independently of how many rows their expert had, and combine sums
// in slot order. Holds for the cpu kernels (checked here) and the ref kernels.
TEST(DispatchInvariance, LocalAndPaddedAreBitwiseEqual) {
  for (KernelSet kernels : {KernelSet::ref, KernelSet::cpu})
  for (DType dt : {DType::f64, DType::f32}) {
    for (Variant v : {Variant::swiglu, Variant::gpt_oss_bias}) {
      for (AbsorbScores a : {AbsorbScores::on, AbsorbScores::off}) {
        LayerRig rig(RouterKind::softmax_topk, v, dt, 29, kernels);
        LocalDispatcher local;
        MoeLayer l = rig.layer(a, local);
        auto want = rig.run(l);
        for (int which : {1, 2}) {
          auto disp = make_dispatcher(which);
          MoeLayer p = rig.layer(a, *disp);
          EXPECT_TRUE(testing::all_results_bitwise(rig.run(p), want))
              << dispatcher_label(which) << (kernels == KernelSet::ref ? " ref " : " cpu ") << dtype_name(dt) << " "
              << testing::variant_name(v) << " absorb " << absorb_scores_name(a);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tiermoe
