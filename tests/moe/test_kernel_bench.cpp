// `bench expert-kernels` (moe/kernel_bench.h) at tiny shapes: every kernel,
// the weight gradients included, is timed for every row count, with the
// experts per case capped by max_rows, and bad options are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tiermoe/core/error.h"
#include "tiermoe/moe/kernel_bench.h"

namespace tiermoe {
namespace {

ExpertKernelBenchOptions tiny() {
  ExpertKernelBenchOptions o;
  o.experts = 4, o.hidden = 32, o.ffn = 16;
  o.rows_per_expert = {1, 5};
  o.max_rows = 12;  // 5 rows per expert: 2 experts
  o.iters = 1;
  return o;
}

TEST(ExpertKernelBench, TimesEveryKernelForEveryRowCount) {
  for (DType dt : {DType::bf16, DType::f32}) {
    ExpertKernelBenchOptions o = tiny();
    o.dtype = dt;
    const ExpertKernelBenchResult r = run_expert_kernel_bench(o);
    const std::vector<std::string> names{"w13_glu", "w2", "w2_dx", "w13_dx", "dw2", "dw13"};
    ASSERT_EQ(r.timings.size(), 2 * names.size());
    for (size_t i = 0; i < r.timings.size(); ++i) {
      const ExpertKernelTiming& t = r.timings[i];
      EXPECT_EQ(t.kernel, names[i % names.size()]);
      EXPECT_EQ(t.rows_per_expert, i < names.size() ? 1 : 5);
      EXPECT_EQ(t.experts, i < names.size() ? 4 : 2) << t.kernel;
      EXPECT_GT(t.seconds, 0) << t.kernel;
      EXPECT_GT(t.tflops, 0) << t.kernel;
      if (r.peak_tflops > 0) {
        EXPECT_DOUBLE_EQ(t.of_peak, t.tflops / r.peak_tflops) << t.kernel;
        // The roofline: the lower of the peak and bandwidth x intensity.
        const double flops = t.tflops * t.seconds * 1e12;
        const double want = std::min(r.peak_tflops, r.read_gbps * 1e9 * flops / t.bytes / 1e12);
        EXPECT_NEAR(t.roofline_tflops, want, 1e-9 * want) << t.kernel;
        EXPECT_DOUBLE_EQ(t.of_roofline, t.tflops / t.roofline_tflops) << t.kernel;
      }
    }
    // W2's least traffic: its G experts' weights, a' in and y out, once.
    const double sz = double(dtype_size(dt));
    const ExpertKernelTiming& w2 = r.timings[names.size() + 1];
    EXPECT_DOUBLE_EQ(w2.bytes, 2 * 32 * 16 * sz + 10 * 16 * sz + 10 * 32 * sz);
    EXPECT_GT(r.read_gbps, 0.1);
    EXPECT_GT(r.pack_bytes, 0);
    EXPECT_NE(r.to_json().find("\"kernel\": \"dw13\""), std::string::npos);
    EXPECT_NE(r.to_table().find("dw2"), std::string::npos);
  }
}

TEST(ExpertKernelBench, RefusesRowCountsBelowOne) {
  ExpertKernelBenchOptions o = tiny();
  o.rows_per_expert = {4, 0};
  EXPECT_THROW(run_expert_kernel_bench(o), Error);
}

}  // namespace
}  // namespace tiermoe
