// Frozen weights at their checkpoint width (CausalLM::from_checkpoint with
// WeightBinding::mapped): a bf16 checkpoint in an f32 (or f64) LoRA run reads
// its matrices in place from the memory-mapped shard. The memory tags show no
// widened copy of them, and loss and every adapter gradient equal the run on
// widened copies (WeightBinding::copy) bit for bit, since bf16 -> f32 is exact
// and the mixed products sum in the plain ones' order (matmul_mixed.h).
#include <map>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "model/model_rig.h"
#include "tiermoe/io/hf_names.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;
using testing::Family;
using testing::TempDir;
using testing::throws_error_with;

bool is_matrix(HfRole r) {
  return r == HfRole::embedding || r == HfRole::lm_head || r == HfRole::attention ||
         r == HfRole::dense_mlp || r == HfRole::expert;
}

// A bf16 checkpoint of the 3-layer test model (attention, a dense layer, MoE layers).
ModelConfig write_bf16_checkpoint(const std::string& dir, bool tied,
                                  uint64_t max_shard = 5'000'000'000ull) {
  ModelConfig c = testing::tiny_model_config(Family::qwen3, tied, true);
  CausalLM model(c, DType::bf16);
  testing::randomize(model, 7);
  model.save_checkpoint(dir, DType::bf16, max_shard);
  return c;
}

LoraConfig every_target() {
  LoraConfig l;
  l.rank = 2;
  l.alpha = 3;
  l.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return l;
}

struct Result {
  double loss;
  std::map<std::string, Tensor> grads;
};

// A LoRA step with a nonzero B, so every adapter and the inputs carry gradient.
Result lora_step(CausalLM& model) {
  model.enable_lora(every_target(), 3);
  Rng rng(5);
  for (ModelParam& p : model.lora_params()) {
    if (p.name.ends_with("lora_B.weight")) fill_normal(p.value, rng, 0.0, 0.3);
  }
  const testing::Batch b = testing::make_batch(model.config().vocab_size, 11, 2, 6);
  Result r;
  r.loss = model.forward(b.ids, b.targets, b.B, b.T);
  model.backward();
  for (ModelParam& p : model.lora_params()) r.grads.emplace(p.name, p.grad.clone());
  return r;
}

void expect_same(const Result& got, const Result& want) {
  EXPECT_EQ(got.loss, want.loss);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (const auto& [name, g] : want.grads) {
    EXPECT_TRUE(bitwise_equal(got.grads.at(name), g, name)) << name;
  }
}

class ModelMapped : public ::testing::TestWithParam<DType> {};

TEST_P(ModelMapped, LoraOnStoredWidthWeightsEqualsWidenedCopiesBitwise) {
  for (bool tied : {false, true}) {
    TempDir dir;
    write_bf16_checkpoint(dir.path().string(), tied);
    CausalLM copy = CausalLM::from_checkpoint(dir.path().string(), GetParam());
    CausalLM mapped =
        CausalLM::from_checkpoint(dir.path().string(), GetParam(), nullptr, WeightBinding::mapped);
    EXPECT_TRUE(mapped.weights_bound());
    expect_same(lora_step(mapped), lora_step(copy));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ModelMapped, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

// The tags: the matrices are counted under `mapped` at bf16 width, `weights`
// holds only the norms and routers (widened), so no f32 copy of a matrix
// exists; the copy path holds every tensor widened.
TEST(ModelMapped, MemoryTagsShowNoWidenedCopyOfTheMatrices) {
  TempDir dir;
  const ModelConfig c = write_bf16_checkpoint(dir.path().string(), false);
  size_t matrices = 0, others = 0;
  for (const HfTensor& t : hf_tensors(c)) {
    (is_matrix(t.role) ? matrices : others) += size_t(shape_numel(t.shape));
  }
  MemoryTracker& mem = MemoryTracker::process();
  const size_t w0 = mem.live(MemTag::weights), m0 = mem.live(MemTag::mapped);
  {
    CausalLM mapped =
        CausalLM::from_checkpoint(dir.path().string(), DType::f32, nullptr, WeightBinding::mapped);
    EXPECT_EQ(mem.live(MemTag::mapped) - m0, matrices * 2);
    EXPECT_EQ(mem.live(MemTag::weights) - w0, others * 4);
    for (ModelParam& p : mapped.params()) {
      EXPECT_EQ(p.value.dtype(), is_matrix(p.role) ? DType::bf16 : DType::f32) << p.name;
    }
  }
  EXPECT_EQ(mem.live(MemTag::mapped), m0);  // the views died with the model
  EXPECT_EQ(mem.live(MemTag::weights), w0);
  {
    CausalLM copy = CausalLM::from_checkpoint(dir.path().string(), DType::f32);
    EXPECT_EQ(mem.live(MemTag::mapped), m0);
    EXPECT_EQ(mem.live(MemTag::weights) - w0, (matrices + others) * 4);
  }
}

// One tensor per shard: gate_proj and up_proj (stacked into one matrix) are
// no longer back to back, so each pair is one copy at the stored width
// (weights, bf16), the other matrices stay views; results are unchanged.
TEST(ModelMapped, SplitPairsAreCopiedAtTheirStoredWidth) {
  TempDir whole, split;
  const ModelConfig c = write_bf16_checkpoint(whole.path().string(), false);
  write_bf16_checkpoint(split.path().string(), false, /*max_shard=*/1);
  size_t pairs = 0, views = 0, others = 0;
  for (const HfTensor& t : hf_tensors(c)) {
    const size_t n = size_t(shape_numel(t.shape));
    const bool pair = t.name.ends_with("gate_proj.weight") || t.name.ends_with("up_proj.weight");
    if (!is_matrix(t.role))
      others += n;
    else
      (pair ? pairs : views) += n;
  }
  MemoryTracker& mem = MemoryTracker::process();
  const size_t w0 = mem.live(MemTag::weights), m0 = mem.live(MemTag::mapped);
  CausalLM mapped =
      CausalLM::from_checkpoint(split.path().string(), DType::f32, nullptr, WeightBinding::mapped);
  EXPECT_EQ(mem.live(MemTag::mapped) - m0, views * 2);
  EXPECT_EQ(mem.live(MemTag::weights) - w0, others * 4 + pairs * 2);
  CausalLM copy = CausalLM::from_checkpoint(whole.path().string(), DType::f32);
  expect_same(lora_step(mapped), lora_step(copy));
}

TEST(ModelMapped, BoundWeightsCannotBeUnfrozen) {
  TempDir dir;
  write_bf16_checkpoint(dir.path().string(), false);
  CausalLM m =
      CausalLM::from_checkpoint(dir.path().string(), DType::f32, nullptr, WeightBinding::mapped);
  EXPECT_TRUE(throws_error_with([&] { m.set_requires_grad("model.embed_tokens.weight", true); },
                                {"cannot be trained", "WeightBinding::copy"}));
  EXPECT_TRUE(throws_error_with([&] { m.set_requires_grad_all(true); }, {"cannot be trained"}));
  m.set_requires_grad_all(false);  // freezing stays allowed
}

}  // namespace
}  // namespace tiermoe
