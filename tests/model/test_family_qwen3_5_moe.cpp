// Qwen3.5-MoE (qwen3_5_moe_text) against transformers 5 itself, in f64
// (model/family_fixture.h): Gated DeltaNet layers around a gated attention
// layer, norms by 1 + w, every layer MoE with the gated shared expert. Each
// piece the check should see is taken out once, and the check must then fail.
#include "io/test_safetensors_util.h"
#include "model/family_fixture.h"

namespace tiermoe {
namespace {

using testing::check_family;
using testing::expect_peft_loss_and_export;
using testing::FamilyDir;
using testing::fill_params;
using testing::off_by_with;

TEST(FamilyQwen3_5Moe, EvalWindowsMatchTransformers) { check_family("qwen3_5_moe", "eval"); }
// transformers' reference runs each packed document alone: TierMoE restarts
// the DeltaNet's conv and state at each document of a row.
TEST(FamilyQwen3_5Moe, PackedDocumentsMatchTransformers) { check_family("qwen3_5_moe", "packed"); }

// The check sees the DeltaNet's decay (A_log: g = 0 keeps the whole state),
// its conv, the attention's output gate, and the norms' 1 + w.
TEST_F(FamilyDir, TheCheckFailsWithoutEachQwen3_5MoePiece) {
  EXPECT_LT(off_by_with("qwen3_5_moe", [](CausalLM&) {}), 1.0);
  EXPECT_GT(off_by_with("qwen3_5_moe", [](CausalLM& m) { fill_params(m, "A_log", -1e3); }), 1e3);
  EXPECT_GT(off_by_with("qwen3_5_moe", [](CausalLM& m) { fill_params(m, "conv1d.weight", 0.0); }),
            1e3);
  EXPECT_GT(off_by_with("qwen3_5_moe",
                        [](CausalLM& m) {
                          // Every gate row of q_proj zeroed: sigmoid 0.5, not the gate's.
                          for (ModelParam& p : m.params()) {
                            if (!p.name.ends_with("self_attn.q_proj.weight")) continue;
                            const int64_t P = 8, rows = p.value.size(0), D = p.value.size(1);
                            for (int64_t r = 0; r < rows; ++r) {
                              if ((r / P) % 2 == 0) continue;
                              for (int64_t d = 0; d < D; ++d) p.value.set(r * D + d, 0.0);
                            }
                          }
                        }),
            1e3);
  EXPECT_GT(off_by_with("qwen3_5_moe",
                        [](CausalLM& m) { fill_params(m, "input_layernorm.weight", 1.0); }),
            1e3);
}

TEST_F(FamilyDir, Qwen3_5MoeAdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("qwen3_5_moe", dir_);
}

}  // namespace
}  // namespace tiermoe
