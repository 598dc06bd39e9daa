// MiniMax-M2 (minimax_m2) against transformers 5 itself, in f64
// (model/family_fixture.h): Mixtral's block and names under a sigmoid router
// choosing on the block's e_score_correction_bias, renormalised; OLMoE's
// whole-projection q/k norm with RoPE on half of each head. Each piece the
// check should see is taken out once, and the check must then fail.
#include "io/test_safetensors_util.h"
#include "model/family_fixture.h"

namespace tiermoe {
namespace {

using testing::check_family;
using testing::expect_peft_loss_and_export;
using testing::FamilyDir;
using testing::fill_params;
using testing::off_by_with;
using testing::with_config;

TEST(FamilyMinimaxM2, EvalWindowsMatchTransformers) { check_family("minimax_m2", "eval"); }
TEST(FamilyMinimaxM2, PackedDocumentsMatchTransformers) { check_family("minimax_m2", "packed"); }

// The check sees the selection bias (zeroed), the q/k norms (ones) and the
// partial rope (all of each head turned).
TEST_F(FamilyDir, TheCheckFailsWithoutEachMinimaxM2Piece) {
  EXPECT_LT(off_by_with("minimax_m2", [](CausalLM&) {}), 1.0);
  EXPECT_GT(off_by_with("minimax_m2",
                        [](CausalLM& m) { fill_params(m, "e_score_correction_bias", 0.0); }),
            1e3);
  EXPECT_GT(off_by_with("minimax_m2", [](CausalLM& m) { fill_params(m, "q_norm.weight", 1.0); }),
            1e3);
  std::filesystem::create_directories(dir_ / "rope");
  EXPECT_GT(off_by_with(
                "minimax_m2", [](CausalLM&) {},
                with_config("minimax_m2", dir_ / "rope",
                            {{"rope_parameters", {{"partial_rotary_factor", 1.0}}}})),
            1e3);
}

// Released configs give the partial rope as rotary_dim (a factor given
// wins, as transformers' setdefault), and name what transformers computes
// one way only; another value of those is refused, naming the field.
TEST(FamilyMinimaxM2, ReleasedConfigFieldsReadStrictly) {
  auto parse = [](const std::string& extra) {
    return parse_model_config(R"({"model_type": "minimax_m2")" + extra + "}", "config.json");
  };
  const ModelConfig bare = parse("");
  EXPECT_EQ(bare.head_dim, 128);  // the class's, not hidden_size / heads
  EXPECT_EQ(bare.rotary_dim(), 128);
  EXPECT_EQ(parse(R"(, "rotary_dim": 64)").rotary_dim(), 64);
  EXPECT_EQ(parse(R"(, "rotary_dim": 64, "partial_rotary_factor": 0.25)").rotary_dim(), 32);
  const ModelConfig released = parse(
      R"(, "rotary_dim": 64, "use_qk_norm": true, "qk_norm_type": "per_layer",
         "scoring_func": "sigmoid", "use_routing_bias": true, "shared_intermediate_size": 0,
         "attn_type_list": [1, 1, 1])");
  EXPECT_EQ(released.rotary_dim(), 64);
  const std::pair<const char*, std::vector<std::string>> refused[] = {
      {R"(, "use_qk_norm": false)", {"use_qk_norm"}},
      {R"(, "qk_norm_type": "per_head")", {"qk_norm_type", "per_layer"}},
      {R"(, "scoring_func": "softmax")", {"scoring_func"}},
      {R"(, "shared_intermediate_size": 512)", {"shared_intermediate_size"}},
      {R"(, "output_router_logits": true)", {"output_router_logits", "not implemented"}},
      {R"(, "attn_type_list": [1, 0])", {"attn_type_list", "0 at layer 1", "lightning"}}};
  for (const auto& [extra, words] : refused) {
    EXPECT_TRUE(testing::throws_error_with([&] { parse(extra); }, words)) << extra;
  }
}

// The published shapes: 230B parameters, 10B active (without the input
// embedding), as MiniMax states them; the tiny preset reads back as itself.
TEST(FamilyMinimaxM2, PresetsAreThePublishedShapes) {
  const ModelConfig m2 = preset("minimax-m2");
  EXPECT_EQ(m2.family, ModelFamily::minimax_m2);
  EXPECT_EQ(m2.rotary_dim(), 64);
  const ParamCounts n = param_counts(m2);
  EXPECT_NEAR(double(n.total) / 1e9, 230, 3);
  EXPECT_NEAR(double(n.active_per_token - n.embedding) / 1e9, 10, 0.5);
  for (const char* name : {"minimax-m2", "tiny-minimax-m2"}) {
    const ModelConfig c = preset(name);
    EXPECT_EQ(parse_model_config(c.to_json(), "written").to_json(), c.to_json()) << name;
  }
}

TEST_F(FamilyDir, MinimaxM2AdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("minimax_m2", dir_);
}

}  // namespace
}  // namespace tiermoe
