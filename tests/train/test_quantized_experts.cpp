// Routed experts kept at int4/int8 (TrainConfig::experts, CausalLM::
// quantize_experts): a LoRA run over them equals, bit for bit, the same run
// over experts bound with their dequantized weights, trains, holds a
// fraction of the bytes, and refuses what it cannot do.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/testing.h"
#include "tiermoe/model/causal_lm.h"
#include "tiermoe/train/trainer.h"
#include "tiermoe/train/trainer_config.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;

TrainConfig int4_run(DType dtype, bool expert_lora = false) {
  TrainConfig c;
  c.preset = "tiny";
  c.layers = 2;
  c.dtype = dtype;
  c.seed = 5;
  c.corpus_tokens = 4096;
  c.trainer.steps = 3;
  c.trainer.batch = 2;
  c.trainer.seq_len = 32;
  c.trainer.schedule.base_lr = 3e-3;
  c.trainer.data_seed = c.seed;
  c.lora = LoraConfig{};
  if (expert_lora) c.lora->targets.insert({"gate_proj", "up_proj", "down_proj"});
  c.experts = QuantFormat::int4;
  c.experts_group = 32;
  return c;
}

// The same model with every expert bound to its quantized weights,
// dequantized to the run's dtype.
CausalLM with_dequantized_experts(const TrainConfig& c, CausalLM& quantized) {
  TrainConfig plain = c;
  plain.experts.reset();
  CausalLM model = build_model(plain);
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    if (!model.layer(l).is_moe()) continue;
    const GroupedExperts& q = quantized.layer(l).moe()->experts();
    GroupedExperts& ex = model.layer(l).moe()->experts();
    for (int64_t e = 0; e < ex.config().num_experts; ++e) {
      ex.bind_expert_weights(e, dequantize(q.quantized_w13(e), c.dtype),
                             dequantize(q.quantized_w2(e), c.dtype));
    }
  }
  return model;
}

class QuantizedExpertsRun : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantizedExpertsRun,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_expert_lora" : "");
                         });

// Three optimizer steps: every loss and every LoRA weight bitwise those of
// the dequantized twin (on the grouped kernels, or with expert LoRA on the
// per-expert path, which reads weights(e)'s dequantized copies).
TEST_P(QuantizedExpertsRun, EqualsTheRunOverDequantizedExpertsBitwise) {
  const auto [dtype, expert_lora] = GetParam();
  const TrainConfig c = int4_run(dtype, expert_lora);
  CausalLM q = build_model(c);
  CausalLM d = with_dequantized_experts(c, q);
  const auto rows = build_data(c, q.config());
  Trainer tq(q, *rows, c.trainer), td(d, *rows, c.trainer);
  for (int s = 0; s < 3; ++s) {
    const StepStats a = tq.step(), b = td.step();
    EXPECT_EQ(a.loss, b.loss) << "step " << s;
  }
  ASSERT_EQ(tq.parameters().size(), td.parameters().size());
  for (size_t i = 0; i < tq.parameters().size(); ++i) {
    EXPECT_TRUE(bitwise_equal(tq.parameters()[i].value, td.parameters()[i].value,
                              tq.parameters()[i].name));
  }
}

TEST(QuantizedExperts, HoldAFractionOfTheBytesAndTrain) {
  // LoRA on attention and on the experts, rank 16: the random tiny model
  // learns the built-in corpus within tens of steps.
  TrainConfig c = int4_run(DType::bf16, /*expert_lora=*/true);
  c.lora->rank = 16;
  c.lora->alpha = 16;
  c.trainer.steps = 40;
  c.trainer.batch = 4;
  c.trainer.seq_len = 64;
  c.trainer.schedule.base_lr = 1e-2;
  c.trainer.schedule.warmup_steps = 2;
  CausalLM q = build_model(c);
  int64_t held = 0;
  for (int64_t l = 0; l < q.num_layers(); ++l) {
    if (q.layer(l).is_moe()) held += q.layer(l).moe()->experts().weight_bytes();
  }
  TrainConfig plain = c;
  plain.experts.reset();
  CausalLM b = build_model(plain);
  int64_t widened = 0;
  for (int64_t l = 0; l < b.num_layers(); ++l) {
    if (b.layer(l).is_moe()) widened += b.layer(l).moe()->experts().weight_bytes();
  }
  // int4 g32: 4 bits a value and 32 bits a group, against 16.
  EXPECT_LT(double(held), 0.32 * double(widened));
  const auto rows = build_data(c, q.config());
  Trainer t(q, *rows, c.trainer);
  double first = 0, last = 0;
  for (int s = 0; s < c.trainer.steps; ++s) {
    const double loss = t.step().loss;
    if (s < 5) first += loss / 5;
    if (s >= c.trainer.steps - 5) last += loss / 5;
  }
  EXPECT_LT(last, first - 0.05) << "the LoRA run over int4 experts did not learn";
}

TEST(QuantizedExperts, RefusedWhereTheyCannotRun) {
  TrainConfig full = int4_run(DType::bf16);
  full.lora.reset();
  EXPECT_THROW(full.validate(), Error);  // full fine-tuning trains the experts
  TrainConfig mx = int4_run(DType::bf16);
  mx.experts = QuantFormat::mxfp4;  // read from checkpoints, not made at load
  EXPECT_THROW(mx.validate(), Error);
  TrainConfig f64 = int4_run(DType::f64);
  EXPECT_THROW(f64.validate(), Error);
  // The setting survives a checkpoint's trainer_state.json.
  const TrainConfig back = TrainConfig::from_json(int4_run(DType::bf16).to_json(), "test");
  ASSERT_TRUE(back.experts.has_value());
  EXPECT_EQ(*back.experts, QuantFormat::int4);
  EXPECT_EQ(back.experts_group, 32);
}

}  // namespace
}  // namespace tiermoe
