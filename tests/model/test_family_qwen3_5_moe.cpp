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

// The release as shipped: the multimodal checkpoint (config under
// text_config, the text model under model.language_model., a vision tower
// and an mtp. tensor beside it) reads as its text model, which is the text
// fixture weight for weight: the same loss and gradients as transformers'.
TEST(FamilyQwen3_5Moe, TheMultimodalReleaseReadsAsItsTextModel) {
  testing::SingleThread one_thread;
  const std::string text = testing::kFamilies + "qwen3_5_moe";
  const std::string release = testing::kFamilies + "qwen3_5_moe_multimodal";
  const ModelConfig c = load_model_config(release);
  EXPECT_EQ(c.family, ModelFamily::qwen3_5_moe);
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.layer_types, load_model_config(text).layer_types);
  const nlohmann::json expected = testing::expected_of(text);
  CausalLM model = CausalLM::from_checkpoint(release, DType::f64);
  const double loss =
      testing::forward(model, expected, testing::batch_of(text, expected, "eval"), true);
  model.backward();
  const double want = expected.at("eval").at("loss");
  EXPECT_NEAR(loss, want, testing::kRtol * want);
  testing::expect_grads_match(model.params(), text + "/grads_eval.safetensors", testing::kRtol,
                              "multimodal release");
  EXPECT_TRUE(testing::throws_error_with(
      [] { parse_model_config(R"({"model_type": "qwen3_5_moe"})", "config.json"); },
      {"qwen3_5_moe", "text_config"}));
}

TEST_F(FamilyDir, Qwen3_5MoeAdapterGivesPeftsLossAndExportsAsIs) {
  expect_peft_loss_and_export("qwen3_5_moe", dir_);
}

// layer_types absent: full_attention_interval's rule (every 4th layer by
// default); a wrong count, kind or width is refused, naming the field.
TEST(FamilyQwen3_5Moe, ConfigFieldsReadStrictly) {
  auto parse = [](const std::string& extra) {
    return parse_model_config(R"({"model_type": "qwen3_5_moe_text")" + extra + "}", "config.json");
  };
  const ModelConfig bare = parse(R"(, "num_hidden_layers": 8)");
  EXPECT_EQ(bare.layer_types,
            (std::vector<std::string>{"linear_attention", "linear_attention", "linear_attention",
                                      "full_attention", "linear_attention", "linear_attention",
                                      "linear_attention", "full_attention"}));
  EXPECT_TRUE(bare.linear_attention(0));
  EXPECT_FALSE(bare.linear_attention(3));
  EXPECT_EQ(bare.attention_module(0), "linear_attn");
  EXPECT_EQ(bare.attention_module(3), "self_attn");
  EXPECT_EQ(bare.rotary_dim(), 64);  // a quarter of head_dim 256
  EXPECT_EQ(parse(R"(, "num_hidden_layers": 4, "full_attention_interval": 2)").layer_types,
            (std::vector<std::string>{"linear_attention", "full_attention", "linear_attention",
                                      "full_attention"}));
  const std::pair<const char*, std::vector<std::string>> refused[] = {
      {R"(, "num_hidden_layers": 3, "layer_types": ["full_attention"])",
       {"layer_types", "1 layers of 3"}},
      {R"(, "num_hidden_layers": 1, "layer_types": ["sliding_attention"])",
       {"layer_types", "sliding_attention", "at layer 0"}},
      {R"(, "full_attention_interval": 0)", {"full_attention_interval"}},
      {R"(, "linear_num_value_heads": 24)", {"linear_num_value_heads", "multiple"}},
      {R"(, "linear_conv_kernel_dim": 0)", {"linear_conv_kernel_dim"}}};
  for (const auto& [extra, words] : refused) {
    EXPECT_TRUE(testing::throws_error_with([&] { parse(extra); }, words)) << extra;
  }
}

// The published shapes: Qwen3.5-35B-A3B's text model, about 34.7B
// parameters (35B with its vision tower and MTP layer) of which about 3B are
// active a token without the input embedding; a cut to 2 layers runs both kinds; the tiny preset
// reads back as itself.
TEST(FamilyQwen3_5Moe, PresetsAreThePublishedShapes) {
  const ModelConfig full = preset("qwen3.5-35b-a3b");
  EXPECT_EQ(full.family, ModelFamily::qwen3_5_moe);
  const ParamCounts n = param_counts(full);
  EXPECT_NEAR(double(n.total) / 1e9, 34.7, 0.1);
  EXPECT_NEAR(double(n.active_per_token - n.embedding) / 1e9, 3.0, 0.1);
  // The count is the checkpoint's: every tensor init writes.
  int64_t written = 0;
  for (const HfTensor& t : hf_tensors(full)) written += shape_numel(t.shape);
  EXPECT_EQ(n.total, written);
  EXPECT_EQ(preset("qwen3.5-35b-a3b", 2).layer_types,
            (std::vector<std::string>{"linear_attention", "full_attention"}));
  for (const char* name : {"qwen3.5-35b-a3b", "tiny-qwen3.5-moe"}) {
    const ModelConfig c = preset(name);
    EXPECT_EQ(parse_model_config(c.to_json(), "written").to_json(), c.to_json()) << name;
  }
}

}  // namespace
}  // namespace tiermoe
