// TieredExperts on a CpuDevice against HostExperts over the same experts:
// outputs, saved activations, dx, d score and weight gradients bitwise
// (docs/architecture.md, parity rules), the exact launches for a fixed routing, remat
// replay, and faults that must not change a result.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <tuple>

#include "moe/moe_test_util.h"
#include "tiermoe/moe/expert_math.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/cpu_device.h"
#include "tiermoe/tier/tiered_experts.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;
using testing::Variant;

constexpr int64_t kE = 6, kD = 32, kF = 24, kBlock = 32;
// Rows per expert: a lone row, two launches (32 + 8), three (32 + 32 + 6
// padded to 8), one padded launch (9 -> 12), none, and a host expert. The
// ladder is 8, 12, 16, 24, 32.
const std::vector<int64_t> kCount = {1, 40, 70, 9, 0, 13};
// Experts 1, 2, 3 and 4 (no rows) are resident; 0 and 5 stay on the host.
const std::vector<uint8_t> kResident = {0, 1, 1, 1, 1, 0};

std::vector<int64_t> offsets(const std::vector<int64_t>& count) {
  std::vector<int64_t> off{0};
  for (int64_t c : count) off.push_back(off.back() + c);
  return off;
}

// One fixture: experts, their host executor, a CPU device and the tier.
// With `quant` the experts' W13 and W2 are random matrices of those layouts.
struct Rig {
  Rig(Variant v, DType dt, size_t device_bytes = size_t(64) << 20,
      std::optional<ExpertQuant> quant = std::nullopt)
      : dtype(dt) {
    ExpertsConfig cfg = testing::experts_config(v, kE, kD, kF);
    cfg.dw_row_block = kBlock;
    experts = std::make_unique<GroupedExperts>(cfg, dt, "layer0.experts");
    Rng rng(7);
    testing::fill_experts(*experts, rng);
    if (quant) {
      std::vector<QuantMatrix> w13, w2;
      for (int64_t e = 0; e < kE; ++e) {
        w13.push_back(random_quant_matrix(quant->w13, 2 * kF, kD, rng));
        w2.push_back(random_quant_matrix(quant->w2, kD, kF, rng));
      }
      experts->bind_quantized_weights(std::move(w13), std::move(w2));
    }
    host = std::make_unique<HostExperts>(*experts);
    device = std::make_unique<CpuDevice>(CpuDeviceConfig{.memory_bytes = device_bytes});
    shape = ExpertShape{kD, kF, dt, cfg.bias, cfg.activation, /*absorb=*/true, quant};
    workspace = std::make_unique<TierWorkspace>(*device, shape, kBlock);
    tiered = std::make_unique<TieredExperts>(*experts, *host, *device, *workspace,
                                             bucket_ladder(8, kBlock));
  }
  DType dtype;
  ExpertShape shape;
  std::unique_ptr<GroupedExperts> experts;
  std::unique_ptr<HostExperts> host;
  std::unique_ptr<CpuDevice> device;
  std::unique_ptr<TierWorkspace> workspace;
  std::unique_ptr<TieredExperts> tiered;
};

// Everything one forward + backward produces.
struct Outputs {
  Tensor y, h, a, dx, dscore;
  std::vector<Tensor> grads;
};

struct Inputs {
  std::vector<int64_t> offset_E;
  Tensor x_ND, score_N, dy_ND;
};

Inputs make_inputs(DType dt, bool absorb, uint64_t seed = 3) {
  Rng rng(seed);
  Inputs in;
  in.offset_E = offsets(kCount);
  const int64_t N = in.offset_E.back();
  in.x_ND = testing::random_tensor({N, kD}, dt, rng);
  in.dy_ND = testing::random_tensor({N, kD}, dt, rng);
  if (absorb) {
    in.score_N = Tensor::empty({N}, dt == DType::f64 ? DType::f64 : DType::f32);
    for (int64_t n = 0; n < N; ++n) in.score_N.set(n, rng.uniform(0.1, 1.0));
  }
  return in;
}

// forward, then (when some activations were dropped) a replay, then backward.
Outputs run(ExpertExecutor& ex, GroupedExperts& experts, const Inputs& in, bool weight_grads,
        const ExpertSaves& keep = {}) {
  const int64_t N = in.x_ND.size(0);
  const DType dt = in.x_ND.dtype();
  Outputs r;
  r.y = Tensor::zeros({N, kD}, dt);
  SavedTensors saved("experts");
  ex.forward(r.y, in.x_ND, in.offset_E, in.score_N, saved, keep);
  ExpertStages replay{.w13 = !keep.h, .act = !keep.a};
  if (replay.any()) ex.replay(saved, in.x_ND, in.offset_E, in.score_N, replay);
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

::testing::AssertionResult same(const Outputs& got, const Outputs& want) {
  for (auto [g, w, name] : {std::tuple{&got.y, &want.y, "y_ND"}, {&got.h, &want.h, "h_N2F"},
                            {&got.a, &want.a, "a_NF"}, {&got.dx, &want.dx, "dx_ND"}}) {
    if (auto r = bitwise_equal(*g, *w, name); !r) return r;
  }
  if (want.dscore.defined()) {
    if (auto r = bitwise_equal(got.dscore, want.dscore, "dscore_N"); !r) return r;
  }
  if (got.grads.size() != want.grads.size()) return ::testing::AssertionFailure() << "grads";
  for (size_t i = 0; i < got.grads.size(); ++i) {
    if (auto r = bitwise_equal(got.grads[i], want.grads[i], "grad " + std::to_string(i)); !r) {
      return r;
    }
  }
  return ::testing::AssertionSuccess();
}

using Param = std::tuple<DType, bool /*absorb*/, bool /*weight grads*/, Variant>;

class TieredParity : public ::testing::TestWithParam<Param> {};

TEST_P(TieredParity, DevicePathEqualsHostPathBitwise) {
  const auto [dt, absorb, weight_grads, variant] = GetParam();
  Rig rig(variant, dt);
  const Inputs in = make_inputs(dt, absorb);
  const Outputs want = run(*rig.host, *rig.experts, in, weight_grads);

  rig.tiered->set_resident(kResident, weight_grads);
  const Outputs got = run(*rig.tiered, *rig.experts, in, weight_grads);
  EXPECT_TRUE(same(got, want));

  // The exact launches: expert 1 takes 32 + 8 rows, expert 2 32 + 32 + 8
  // (6 padded to 8), expert 3 12 (9 padded), expert 4 none; forward and backward.
  const TierLayerStats s = rig.tiered->take_stats();
  EXPECT_EQ(s.device_calls, 2 * 6);
  EXPECT_EQ(s.rows, 133);
  EXPECT_EQ(s.device_rows, 40 + 70 + 9);
  EXPECT_EQ(s.padded_rows, 2 * (2 + 3));
  const DeviceCounters c = rig.device->counters();
  const ExpertShape shape{kD, kF, dt, variant == Variant::gpt_oss_bias,
                          variant == Variant::gpt_oss_bias ? ExpertActivation::gpt_oss
                                                           : ExpertActivation::swiglu,
                          absorb};
  const GraphKind bwd = weight_grads ? GraphKind::expert_bwd_dx_dw : GraphKind::expert_bwd_dx;
  auto calls = [&](GraphKind kind, int64_t G) {
    GraphKey k = expert_graph_key(kind, shape, G);
    if (variant == Variant::gpt_oss_bias) k.gpt_oss = rig.experts->config().gpt_oss;
    auto it = c.calls.find(k.str());
    return it == c.calls.end() ? int64_t{0} : it->second;
  };
  EXPECT_EQ(calls(GraphKind::expert_fwd, 32), 3);
  EXPECT_EQ(calls(GraphKind::expert_fwd, 8), 2);
  EXPECT_EQ(calls(GraphKind::expert_fwd, 12), 1);
  EXPECT_EQ(calls(GraphKind::expert_fwd, 16), 0);
  EXPECT_EQ(calls(bwd, 32), 3);
  EXPECT_EQ(calls(bwd, 8), 2);
  EXPECT_EQ(calls(bwd, 12), 1);
}

INSTANTIATE_TEST_SUITE_P(
    Tier, TieredParity,
    ::testing::Combine(::testing::Values(DType::f64, DType::f32, DType::bf16),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(Variant::swiglu, Variant::gpt_oss_bias)),
    [](const auto& info) {
      return std::string(dtype_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_absorbed" : "_postcombine") +
             (std::get<2>(info.param) ? "_full" : "_dxonly") + "_" +
             testing::variant_name(std::get<3>(info.param));
    });

TEST(Tiered, ReplayOnTheDeviceEqualsTheHost) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Rig rig(Variant::swiglu, dt);
    const Inputs in = make_inputs(dt, true);
    const ExpertSaves dropped{.h = false, .a = false};
    const Outputs want = run(*rig.host, *rig.experts, in, true, dropped);
    rig.tiered->set_resident(kResident, true);
    const Outputs got = run(*rig.tiered, *rig.experts, in, true, dropped);
    EXPECT_TRUE(same(got, want)) << dtype_name(dt);
    // The replay re-ran W13 on the device: 6 more forward launches.
    EXPECT_EQ(rig.tiered->take_stats().device_calls, 3 * 6);
  }
}

TEST(Tiered, StaleDeviceWeightsAreCaught) {
  // The parity check can fail: change a resident expert's host weights
  // without re-uploading them, and the device computes with the old ones.
  Rig rig(Variant::swiglu, DType::f32);
  const Inputs in = make_inputs(DType::f32, true);
  rig.tiered->set_resident(kResident, true);
  Tensor w = rig.experts->weights(2).w13_FD;
  w.set(5, w.get(5) * 1.5);
  const Outputs want = run(*rig.host, *rig.experts, in, true);
  const Outputs stale = run(*rig.tiered, *rig.experts, in, true);
  EXPECT_FALSE(bitwise_equal(stale.y, want.y, "y_ND"));
  rig.tiered->upload_weights();
  EXPECT_TRUE(same(run(*rig.tiered, *rig.experts, in, true), want));
}

TEST(Tiered, AShiftedScoreIsCaught) {
  // ... and a score shifted by one row on the way to the device shows too.
  Rig rig(Variant::swiglu, DType::f64);
  Inputs in = make_inputs(DType::f64, true);
  const Outputs want = run(*rig.host, *rig.experts, in, true);
  Inputs shifted = in;
  shifted.score_N = in.score_N.clone();
  for (int64_t n = 1; n < in.score_N.numel(); ++n) shifted.score_N.set(n, in.score_N.get(n - 1));
  rig.tiered->set_resident(kResident, true);
  EXPECT_FALSE(bitwise_equal(run(*rig.tiered, *rig.experts, shifted, true).y, want.y, "y_ND"));
}

TEST(Tiered, AFailedLaunchRedoesTheRowsOnTheHost) {
  for (int64_t fail_at : {0, 2, 5}) {
    Rig rig(Variant::swiglu, DType::f32);
    const Inputs in = make_inputs(DType::f32, true);
    const Outputs want = run(*rig.host, *rig.experts, in, true);
    rig.tiered->set_resident(kResident, true);
    rig.device->inject({.fail_launch = fail_at});
    EXPECT_TRUE(same(run(*rig.tiered, *rig.experts, in, true), want)) << "fail at " << fail_at;
    EXPECT_TRUE(rig.tiered->host_only());
    TierLayerStats s = rig.tiered->take_stats();
    EXPECT_EQ(s.faults, 1);
    EXPECT_EQ(s.device_rows, 0);
    // The next step tries the device again, with the same result.
    rig.tiered->begin_step();
    EXPECT_TRUE(same(run(*rig.tiered, *rig.experts, in, true), want));
    EXPECT_EQ(rig.tiered->take_stats().device_rows, 119);
  }
}

TEST(Tiered, ABackwardFaultKeepsTheGradientsExact) {
  Rig rig(Variant::gpt_oss_bias, DType::f64);
  const Inputs in = make_inputs(DType::f64, true);
  const Outputs want = run(*rig.host, *rig.experts, in, true);
  rig.tiered->set_resident(kResident, true);
  // Forward takes 6 launches; the 8th fails in backward, after some experts'
  // sums may have come down: none of them may reach the grads twice.
  rig.device->inject({.fail_launch = 7});
  EXPECT_TRUE(same(run(*rig.tiered, *rig.experts, in, true), want));
  EXPECT_EQ(rig.tiered->take_stats().faults, 1);
}

TEST(Tiered, OutOfMemoryKeepsWhatFitted) {
  Rig rig(Variant::swiglu, DType::f32);
  const size_t per_expert = size_t(3 * kD * kF) * 4;
  // Room for the workspace and two experts' weights.
  Rig small(Variant::swiglu, DType::f32, rig.workspace->bytes() + 2 * per_expert);
  EXPECT_THROW(small.tiered->set_resident(kResident, false), DeviceOutOfMemory);
  EXPECT_EQ(small.tiered->resident_count(), 2);
  EXPECT_LE(small.device->used(), small.device->capacity());
  const Inputs in = make_inputs(DType::f32, true);
  EXPECT_TRUE(same(run(*small.tiered, *small.experts, in, false),
                   run(*rig.host, *rig.experts, in, false)));
}

TEST(Tiered, AdaptedExpertsStayOnTheHost) {
  Rig rig(Variant::post_norm, DType::f32);
  EXPECT_FALSE(rig.tiered->device_capable());
  EXPECT_THROW(rig.tiered->set_resident(kResident, false), Error);
}

// Quantized experts stay at their width on the device: each resident expert
// holds its two images (kernels/quant_image.h) and the graphs decode them
// into the workspace, so every format gives the host's quantized products
// bitwise (fp8's W13 with a scale row per row, as stacked off a block edge).
struct QuantCase {
  const char* name;
  ExpertQuant quant;
  Variant variant;
};

std::vector<QuantCase> quant_cases() {
  const QuantLayout int4{QuantFormat::int4, 16, 1, true}, int8{QuantFormat::int8, 8, 1, false},
      mxfp4{QuantFormat::mxfp4, 32, 1, false}, fp8_rows{QuantFormat::fp8, 128, 1, false},
      fp8{QuantFormat::fp8, 128, 128, false};
  return {{"int4_g16_bf16_values", {int4, int4}, Variant::swiglu},
          {"int8_g8", {int8, int8}, Variant::swiglu},
          {"mxfp4_gpt_oss", {mxfp4, mxfp4}, Variant::gpt_oss_bias},
          {"fp8", {fp8_rows, fp8}, Variant::swiglu}};
}

TEST(Tiered, QuantizedExpertsStayAtTheirWidthAndGiveTheHostsBits) {
  for (const QuantCase& k : quant_cases()) {
    for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
      for (bool absorb : {true, false}) {
        const std::string where =
            detail::str_of(k.name, " ", dtype_name(dt), absorb ? " absorbed" : " postcombine");
        Rig rig(k.variant, dt, size_t(64) << 20, k.quant);
        const Inputs in = make_inputs(dt, absorb);
        const Outputs want = run(*rig.host, *rig.experts, in, false);
        rig.tiered->set_resident(kResident, false);
        EXPECT_TRUE(same(run(*rig.tiered, *rig.experts, in, false), want)) << where;
        EXPECT_EQ(rig.tiered->take_stats().device_rows, 119) << where;
        // Four resident experts, each its images (and biases), as the cost
        // model counts them: fewer bytes than the widened weights.
        EXPECT_EQ(rig.tiered->device_bytes(), 4 * bytes_upload(rig.shape)) << where;
        ExpertShape widened = rig.shape;
        widened.quant.reset();
        EXPECT_LT(bytes_upload(rig.shape), bytes_upload(widened)) << where;
      }
    }
  }
}

TEST(Tiered, StaleQuantizedImagesAreCaught) {
  // The check above can fail: change a code of a resident expert on the
  // host only, and the device computes with its old image until re-uploaded.
  Rig rig(Variant::swiglu, DType::f32, size_t(64) << 20, quant_cases()[0].quant);
  const Inputs in = make_inputs(DType::f32, true);
  rig.tiered->set_resident(kResident, false);
  // The matrix owns its codes (random_quant_matrix): writable in this test.
  auto* codes = const_cast<uint8_t*>(rig.experts->quantized_w13(2).codes);
  codes[5] ^= 0x11;
  const Outputs want = run(*rig.host, *rig.experts, in, false);
  EXPECT_FALSE(bitwise_equal(run(*rig.tiered, *rig.experts, in, false).y, want.y, "y_ND"));
  rig.tiered->upload_weights();
  EXPECT_TRUE(same(run(*rig.tiered, *rig.experts, in, false), want));
}

}  // namespace
}  // namespace tiermoe
