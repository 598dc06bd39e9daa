// TieredExperts on a GPU against HostExperts over the same experts (the ref
// kernels on the host): outputs, saved activations, dx, d score and weight
// gradients within graph_cases.h's tolerances, the exact launches, a failed
// launch that redoes the call on the host (the host's bits), and an
// out-of-memory that keeps what fitted. Each test skips, saying why,
// without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <tuple>

#include "gpu.h"
#include "graph_cases.h"
#include "tiermoe/moe/saved.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/tiered_experts.h"

namespace tiermoe {
namespace {

using testing::Variant;

constexpr int64_t kE = 6, kD = 64, kF = 48, kBlock = 32;
// A lone row, two launches (32 + 8), three (32 + 32 + 6 padded to 8), one
// padded launch (9 -> 12), none, and a host expert.
const std::vector<int64_t> kCount = {1, 40, 70, 9, 0, 13};
const std::vector<uint8_t> kResident = {0, 1, 1, 1, 1, 0};

struct Rig {
  Rig(Variant v, DType dt, size_t budget = size_t(64) << 20) {
    ExpertsConfig cfg = testing::experts_config(v, kE, kD, kF, KernelSet::ref);
    cfg.dw_row_block = kBlock;
    experts = std::make_unique<GroupedExperts>(cfg, dt, "layer0.experts");
    Rng rng(7);
    testing::fill_experts(*experts, rng, 0.3);
    host = std::make_unique<HostExperts>(*experts);
    device = testing::gpu(budget);
    const ExpertShape shape{kD, kF, dt, cfg.bias, cfg.activation, /*absorb=*/true};
    workspace = std::make_unique<TierWorkspace>(*device, shape, kBlock);
    tiered = std::make_unique<TieredExperts>(*experts, *host, *device, *workspace,
                                             bucket_ladder(8, kBlock));
  }
  ~Rig() {
    tiered.reset();
    workspace.reset();
  }
  std::unique_ptr<GroupedExperts> experts;
  std::unique_ptr<HostExperts> host;
  std::unique_ptr<Device> device;
  std::unique_ptr<TierWorkspace> workspace;
  std::unique_ptr<TieredExperts> tiered;
};

struct Inputs {
  std::vector<int64_t> offset_E{0};
  Tensor x_ND, score_N, dy_ND;
};

Inputs make_inputs(DType dt, bool absorb) {
  Rng rng(3);
  Inputs in;
  for (int64_t c : kCount) in.offset_E.push_back(in.offset_E.back() + c);
  const int64_t N = in.offset_E.back();
  in.x_ND = testing::random_tensor({N, kD}, dt, rng);
  in.dy_ND = testing::random_tensor({N, kD}, dt, rng);
  if (absorb) {
    in.score_N = Tensor::empty({N}, testing::score_dtype_of(dt));
    fill_uniform(in.score_N, rng, 0.1, 1.0);
  }
  return in;
}

struct Outputs {
  Tensor y, h, a, dx, dscore;
  std::vector<Tensor> grads;
};

Outputs run(ExpertExecutor& ex, GroupedExperts& experts, const Inputs& in, bool weight_grads) {
  const int64_t N = in.x_ND.size(0);
  const DType dt = in.x_ND.dtype();
  Outputs r;
  r.y = Tensor::zeros({N, kD}, dt);
  SavedTensors saved("experts");
  ex.forward(r.y, in.x_ND, in.offset_E, in.score_N, saved, ExpertSaves{});
  r.h = saved.get("h_N2F").clone();
  r.a = saved.get("a_NF").clone();
  r.dx = Tensor::zeros({N, kD}, dt);
  if (in.score_N.defined()) r.dscore = Tensor::zeros({N}, in.score_N.dtype());
  experts.zero_grad();
  ex.backward(r.dx, r.dscore, in.dy_ND, in.offset_E, in.score_N, saved, weight_grads, false);
  if (weight_grads) {
    for (const auto& n : experts.param_names()) r.grads.push_back(experts.grad(n).clone());
  }
  return r;
}

// Within tolerance, or (tol 0) bitwise.
::testing::AssertionResult agree(const Outputs& got, const Outputs& want, double tol) {
  auto cmp = [&](const Tensor& g, const Tensor& w, const std::string& name) {
    return tol == 0 ? testing::bitwise_equal(g, w, name) : testing::close(g, w, tol, name);
  };
  for (auto [g, w, name] : {std::tuple{&got.y, &want.y, "y_ND"},
                            {&got.h, &want.h, "h_N2F"},
                            {&got.a, &want.a, "a_NF"},
                            {&got.dx, &want.dx, "dx_ND"}}) {
    if (auto r = cmp(*g, *w, name); !r) return r;
  }
  if (want.dscore.defined()) {
    if (auto r = cmp(got.dscore, want.dscore, "dscore_N"); !r) return r;
  }
  if (got.grads.size() != want.grads.size()) return ::testing::AssertionFailure() << "grads";
  for (size_t i = 0; i < got.grads.size(); ++i) {
    if (auto r = cmp(got.grads[i], want.grads[i], "grad " + std::to_string(i)); !r) return r;
  }
  return ::testing::AssertionSuccess();
}

using Param = std::tuple<DType, bool /*absorb*/, bool /*weight grads*/, Variant>;
class CudaTieredParity : public ::testing::TestWithParam<Param> {};

TEST_P(CudaTieredParity, GpuPathEqualsTheHostPathWithinTolerance) {
  TIERMOE_REQUIRE_GPU();
  const auto [dt, absorb, weight_grads, variant] = GetParam();
  Rig rig(variant, dt);
  const Inputs in = make_inputs(dt, absorb);
  const Outputs want = run(*rig.host, *rig.experts, in, weight_grads);
  rig.tiered->set_resident(kResident, weight_grads);
  EXPECT_TRUE(
      agree(run(*rig.tiered, *rig.experts, in, weight_grads), want, testing::graph_tolerance(dt)));
  const TierLayerStats s = rig.tiered->take_stats();
  EXPECT_EQ(s.device_calls, 2 * 6);
  EXPECT_EQ(s.device_rows, 40 + 70 + 9);
  EXPECT_EQ(s.padded_rows, 2 * (2 + 3));
  EXPECT_GT(s.bytes_up, 0u);
  EXPECT_GT(s.bytes_down, 0u);
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudaTieredParity,
                         ::testing::Combine(::testing::Values(DType::f64, DType::f32, DType::bf16),
                                            ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(Variant::swiglu,
                                                              Variant::gpt_oss_bias)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_absorbed" : "_postcombine") +
                                  (std::get<2>(info.param) ? "_full" : "_dxonly") + "_" +
                                  testing::variant_name(std::get<3>(info.param));
                         });

// An injected launch fault sends the call's device rows to the host: the
// whole call then has the host's bits; the next step uses the GPU again.
TEST(CudaTiered, AFailedLaunchGivesTheHostsResult) {
  TIERMOE_REQUIRE_GPU();
  for (int64_t fail_at : {0, 7}) {  // in forward; in backward
    Rig rig(Variant::swiglu, DType::f32);
    const Inputs in = make_inputs(DType::f32, true);
    const Outputs want = run(*rig.host, *rig.experts, in, true);
    rig.tiered->set_resident(kResident, true);
    rig.device->inject({.fail_launch = fail_at});
    const Outputs got = run(*rig.tiered, *rig.experts, in, true);
    if (fail_at == 0) {
      EXPECT_TRUE(agree(got, want, 0)) << "fail at " << fail_at;
    } else {
      // Forward ran on the GPU, the failed backward's rows on the host: no
      // expert's sums may reach the gradients twice.
      EXPECT_TRUE(agree(got, want, testing::graph_tolerance(DType::f32)));
    }
    EXPECT_EQ(rig.tiered->take_stats().faults, 1);
    rig.tiered->begin_step();
    EXPECT_TRUE(agree(run(*rig.tiered, *rig.experts, in, true), want, 1e-5));
    EXPECT_EQ(rig.tiered->take_stats().device_rows, 119);
  }
}

TEST(CudaTiered, OutOfMemoryKeepsWhatFittedAndTheResultsHold) {
  TIERMOE_REQUIRE_GPU();
  const size_t per_expert = size_t(3 * kD * kF) * 4;
  const ExpertShape shape{kD, kF, DType::f32};
  Rig small(Variant::swiglu, DType::f32, bytes_workspace(shape, kBlock) + 2 * per_expert);
  EXPECT_THROW(small.tiered->set_resident(kResident, false), DeviceOutOfMemory);
  EXPECT_EQ(small.tiered->resident_count(), 2);
  const Inputs in = make_inputs(DType::f32, true);
  Rig host(Variant::swiglu, DType::f32);
  EXPECT_TRUE(agree(run(*small.tiered, *small.experts, in, false),
                    run(*host.host, *host.experts, in, false), 1e-5));
}

}  // namespace
}  // namespace tiermoe
