// The forward's non-finite guard: the first NaN/Inf is reported with the
// layer and half (attention or MLP) it appeared in, or as the loss.
#include <limits>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "model/model_rig.h"

namespace tiermoe {
namespace {

using testing::Family;
using testing::throws_error_with;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

void poison(CausalLM& model, const std::string& name, double value) {
  for (ModelParam& p : model.params()) {
    if (p.name == name) {
      p.value.set(0, value);
      return;
    }
  }
  FAIL() << "no parameter " << name;
}

void expect_guard(DType dt, const std::string& param, double value,
                  std::vector<std::string> words) {
  SCOPED_TRACE(param + " " + std::string(dtype_name(dt)));
  testing::SingleThread one_thread;
  CausalLM model(testing::tiny_model_config(Family::qwen3, false, true), dt);
  testing::randomize(model, 31);
  testing::Batch b = testing::make_batch(40, 32);
  b.ids[0] = 0;  // the poisoned embedding row is looked up
  EXPECT_NO_THROW(model.forward(b.ids, b.targets, b.B, b.T));
  poison(model, param, value);
  words.push_back("lower the learning rate");
  EXPECT_TRUE(throws_error_with([&] { model.forward(b.ids, b.targets, b.B, b.T); }, words));
  EXPECT_TRUE(throws_error_with([&] { model.backward(); }, {"backward without a forward"}));
}

TEST(ModelNonFinite, NamesTheAttentionOfTheFirstBadLayer) {
  expect_guard(DType::f32, "model.layers.2.self_attn.q_proj.weight", kNaN,
               {"model.layers.2.self_attn output", "nan"});
}

TEST(ModelNonFinite, NamesTheDenseMlp) {
  expect_guard(DType::bf16, "model.layers.1.mlp.down_proj.weight", kNaN,
               {"model.layers.1.mlp output"});
}

TEST(ModelNonFinite, NamesTheMoeBlock) {
  // Every expert's down_proj, so whichever experts the tokens pick.
  testing::SingleThread one_thread;
  CausalLM model(testing::tiny_model_config(Family::qwen3, false, true), DType::f32);
  testing::randomize(model, 33);
  for (int e = 0; e < 4; ++e) {
    poison(model, "model.layers.2.mlp.experts." + std::to_string(e) + ".down_proj.weight", kInf);
  }
  testing::Batch b = testing::make_batch(40, 34);
  EXPECT_TRUE(throws_error_with([&] { model.forward(b.ids, b.targets, b.B, b.T); },
                                {"model.layers.2.mlp output"}));
}

TEST(ModelNonFinite, NamesTheEmbedding) {
  expect_guard(DType::bf16, "model.embed_tokens.weight", kInf, {"model.embed_tokens output"});
}

TEST(ModelNonFinite, NamesTheLoss) {
  expect_guard(DType::f32, "lm_head.weight", kNaN, {"the loss is", "logits"});
}

}  // namespace
}  // namespace tiermoe
