// The retained-bytes table of docs/remat.md: one bf16 MoE layer at
// Qwen3-30B-A3B shapes (E 128, K 8, D 2048, F 768, T 4096) per policy,
// absorbed and not, beside the W2 output's analytic N x D x 2 bytes. Several
// GB and tens of seconds, so disabled in the suite; run it with
//   test_remat --gtest_also_run_disabled_tests --gtest_filter='*Qwen3*'
#include <gtest/gtest.h>

#include <cstdio>

#include "tiermoe/moe/bench.h"
#include "tiermoe/remat/policy.h"
#include "tiermoe/remat/report.h"

namespace tiermoe {
namespace {

TEST(RematMeasure, DISABLED_Qwen3LayerRetainedBytesPerPolicy) {
  const int64_t T = 4096, K = 8, D = 2048;
  const size_t w2_output = size_t(T * K * D) * 2;  // N x D bf16
  std::printf("| policy | absorbed | retained, full FT (dW) | retained, LoRA / frozen (dx) "
              "| of which y_ND | W2 output N*D*2 |\n|---|---|---|---|---|---|\n");
  for (const char* p : {"none", "default", "save:w13,w2", "save-w2-only", "full"}) {
    for (AbsorbScores a : {AbsorbScores::on, AbsorbScores::off}) {
      RematPolicy policy = RematPolicy::parse(p);
      size_t retained[2] = {0, 0}, y_nd = 0;
      for (MoeBenchMode mode : {MoeBenchMode::full, MoeBenchMode::fwd}) {
        MoeBenchOptions opt;
        opt.tokens = T;
        opt.absorb_scores = a;
        opt.keep = policy.moe_keep();
        opt.mode = mode;
        opt.warmup = 0, opt.iters = 1;
        MoeBenchResult r = run_moe_layer_bench(opt);
        SavedTensorsReport report(policy.name());
        report.add_moe_layer(r.layer_name, r.saved);
        EXPECT_EQ(report.bytes(), r.retained_bytes);
        retained[mode == MoeBenchMode::fwd] = r.retained_bytes;
        y_nd = 0;
        for (const auto& row : report.rows()) y_nd += row.name == "y_ND" ? row.bytes : 0;
        if (mode == MoeBenchMode::full) std::fprintf(stderr, "%s\n", report.to_table().c_str());
      }
      EXPECT_EQ(y_nd, a == AbsorbScores::on ? 0 : w2_output);
      std::printf("| %s | %s | %s (%zu) | %s (%zu) | %s | %s |\n", p,
                  a == AbsorbScores::on ? "yes" : "no", format_bytes(retained[0]).c_str(),
                  retained[0], format_bytes(retained[1]).c_str(), retained[1],
                  format_bytes(y_nd).c_str(), format_bytes(w2_output).c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace tiermoe
