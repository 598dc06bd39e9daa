// The device tier's parity on every GEMM ISA this machine can run: the host
// runs a layer's cold experts on the grouped kernels (moe/expert_kernels.h),
// the CPU device its resident ones through the per-expert graphs, and every
// output, saved activation and gradient is bitwise the all-host run's. Small
// shapes on every ISA; Qwen3-30B-A3B's expert shapes (D 2048, F 768) in bf16
// on the hardware ISAs (the emulations would take minutes there). An ISA the
// machine lacks is skipped, and says why.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/isa_test_util.h"
#include "moe/moe_test_util.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/cpu_device.h"
#include "tiermoe/tier/tiered_experts.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;
using testing::ScopedIsa;
using testing::Variant;

constexpr int64_t kBlock = 32;

struct Shape3 {
  int64_t D, F;
};

struct Case {
  CpuIsa isa;
  DType dtype;
  Variant variant;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string isa(cpu_isa_name(info.param.isa));
  for (char& c : isa) c = c == '-' ? '_' : c;
  return isa + "_" + std::string(dtype_name(info.param.dtype)) + "_" +
         testing::variant_name(info.param.variant);
}

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16, CpuIsa::amx,
                     CpuIsa::avx512_emu, CpuIsa::avx512bf16_emu, CpuIsa::amx_emu}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      for (Variant var : {Variant::swiglu, Variant::gpt_oss_bias}) v.push_back({isa, dt, var});
    }
  }
  return v;
}

struct Outputs {
  Tensor y, h, a, dx, dscore;
  std::vector<Tensor> grads;
};

// One absorbed forward and a full backward through `ex`.
Outputs run(ExpertExecutor& ex, GroupedExperts& experts, const std::vector<int64_t>& offset_E,
            const Tensor& x, const Tensor& score, const Tensor& dy) {
  const int64_t N = x.size(0), D = x.size(1);
  Outputs r;
  r.y = Tensor::zeros({N, D}, x.dtype());
  SavedTensors saved("experts");
  ex.forward(r.y, x, offset_E, score, saved, ExpertSaves{});
  r.h = saved.get("h_N2F").clone();
  r.a = saved.get("a_NF").clone();
  r.dx = Tensor::zeros({N, D}, x.dtype());
  r.dscore = Tensor::zeros({N}, DType::f32);
  experts.zero_grad();
  ex.backward(r.dx, r.dscore, dy, offset_E, score, saved, /*weight_grads=*/true, false);
  for (const auto& n : experts.param_names()) r.grads.push_back(experts.grad(n).clone());
  return r;
}

// Host-only against a tier holding experts 1 and 2, experts 0 and 3 on the
// host (the bucket ladder is 8, 12, 16, 24, 32).
void expect_parity(Variant variant, DType dt, Shape3 s, const std::vector<int64_t>& count) {
  ExpertsConfig cfg = testing::experts_config(variant, int64_t(count.size()), s.D, s.F);
  cfg.dw_row_block = kBlock;
  GroupedExperts experts(cfg, dt, "layer0.experts");
  Rng rng(5);
  testing::fill_experts(experts, rng, 0.05);
  HostExperts host(experts);
  CpuDevice device(CpuDeviceConfig{.memory_bytes = size_t(256) << 20});
  ExpertShape shape{s.D, s.F, dt, cfg.bias, cfg.activation, /*absorb=*/true};
  TierWorkspace workspace(device, shape, kBlock);
  TieredExperts tiered(experts, host, device, workspace, bucket_ladder(8, kBlock));

  std::vector<int64_t> offset_E{0};
  for (int64_t c : count) offset_E.push_back(offset_E.back() + c);
  const int64_t N = offset_E.back();
  const Tensor x = testing::random_tensor({N, s.D}, dt, rng);
  const Tensor dy = testing::random_tensor({N, s.D}, dt, rng);
  Tensor score = Tensor::empty({N}, DType::f32);
  for (int64_t n = 0; n < N; ++n) score.set(n, rng.uniform(0.1, 1.0));

  const Outputs want = run(host, experts, offset_E, x, score, dy);
  tiered.set_resident({0, 1, 1, 0}, /*trainable=*/true);
  const Outputs got = run(tiered, experts, offset_E, x, score, dy);
  EXPECT_GT(tiered.take_stats().device_rows, 0) << "nothing ran on the device";
  const std::string at = " D" + std::to_string(s.D) + " F" + std::to_string(s.F);
  EXPECT_TRUE(bitwise_equal(got.y, want.y, "y" + at));
  EXPECT_TRUE(bitwise_equal(got.h, want.h, "h" + at));
  EXPECT_TRUE(bitwise_equal(got.a, want.a, "a" + at));
  EXPECT_TRUE(bitwise_equal(got.dx, want.dx, "dx" + at));
  EXPECT_TRUE(bitwise_equal(got.dscore, want.dscore, "dscore" + at));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(got.grads[i], want.grads[i],
                              "d" + experts.param_names()[i] + at));
  }
}

using TierIsa = testing::IsaTest<Case>;

INSTANTIATE_TEST_SUITE_P(Isa, TierIsa, ::testing::ValuesIn(all_cases()), case_name);

TEST_P(TierIsa, DevicePathEqualsHostPathBitwise) {
  const auto [isa, dt, variant] = GetParam();
  // Expert 1's 40 rows are two launches (32 + 8), expert 2's 9 one (-> 12).
  expect_parity(variant, dt, {70, 150}, {3, 40, 9, 17});
}

TEST_P(TierIsa, Qwen3ExpertShapesBitwise) {
  const auto [isa, dt, variant] = GetParam();
  if (cpu_isa_emulated(isa) || dt != DType::bf16 || variant != Variant::swiglu) {
    GTEST_SKIP() << "Qwen3 shapes run in bf16 swiglu on the hardware ISAs only ("
                 << cpu_isa_name(isa) << " " << dtype_name(dt) << " "
                 << testing::variant_name(variant) << " is covered by the small shapes)";
  }
  // Few rows, so that few graphs are built: 9 -> 12 and 5 -> 8.
  expect_parity(variant, dt, {2048, 768}, {2, 9, 5, 3});
}

}  // namespace
}  // namespace tiermoe
