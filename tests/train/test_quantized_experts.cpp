// Routed experts kept at int4/int8 (TrainConfig::experts, CausalLM::
// quantize_experts): a LoRA run over them equals, bit for bit, the same run
// over experts bound with their dequantized weights, trains, holds a
// fraction of the bytes, and refuses what it cannot do.
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/testing.h"
#include "tiermoe/model/causal_lm.h"
#include "tiermoe/train/data.h"
#include "tiermoe/train/markov_corpus.h"
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

// What quantizing costs a trained model: the tiny preset trained by the
// demo's recipe (full fine-tuning, f32, AdamW 3e-3; 300 steps, 0.1 nats
// above the corpus's floor), then its experts quantized in place, on
// held-out windows of the same source. int8 costs under 0.01 nats; int4
// more, still under 0.05 (README: the small preset's figures).
TEST(QuantizedExperts, ATrainedModelLosesLittleToInt8) {
  TrainConfig c;
  c.preset = "tiny";
  c.dtype = DType::f32;
  c.trainer.steps = 300;
  c.trainer.batch = 16;
  c.trainer.seq_len = 64;
  c.trainer.schedule.base_lr = 3e-3;
  c.trainer.schedule.warmup_steps = 20;
  c.corpus_tokens = 1 << 18;
  CausalLM model = build_model(c);
  std::unique_ptr<MarkovCorpus> chain;
  const auto rows = build_data(c, model.config(), &chain);
  Trainer trainer(model, *rows, c.trainer);
  for (int64_t s = 0; s < c.trainer.steps; ++s) trainer.step();
  const TokenWindows held_out(chain->generate(64 * 64 + 1, /*seed=*/99), "held out");
  const TokenBatch batch = held_out.eval_batch(64, 64);
  auto loss = [&] {
    return model.forward(batch.inputs_BL, batch.targets_BL, 64, 64, /*grad=*/false);
  };
  const double exact = loss();
  EXPECT_LT(exact, chain->loss_floor() + 0.2) << "the demo recipe did not train";
  model.set_requires_grad_all(false);
  // int8 first: quantizing the dequantized int8 weights to int4 would
  // stack two roundings. A fresh copy of the trained model for int4.
  std::vector<std::vector<std::pair<Tensor, Tensor>>> trained;
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    std::vector<std::pair<Tensor, Tensor>> layer;
    const GroupedExperts& ex = model.layer(l).moe()->experts();
    for (int64_t e = 0; e < ex.config().num_experts; ++e) {
      layer.emplace_back(ex.weights(e).w13_FD.clone(), ex.weights(e).w2_DF.clone());
    }
    trained.push_back(std::move(layer));
  }
  model.quantize_experts(QuantFormat::int8, 32);
  const double int8 = loss();
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    GroupedExperts& ex = model.layer(l).moe()->experts();
    for (int64_t e = 0; e < ex.config().num_experts; ++e) {
      ex.bind_expert_weights(e, trained[size_t(l)][size_t(e)].first,
                             trained[size_t(l)][size_t(e)].second);
    }
  }
  EXPECT_EQ(loss(), exact) << "rebinding the trained experts did not restore them";
  model.quantize_experts(QuantFormat::int4, 32);
  const double int4 = loss();
  std::cout << "held-out loss " << exact << ", int8 g32 +" << int8 - exact << ", int4 g32 +"
            << int4 - exact << " nats\n";
  EXPECT_LT(std::abs(int8 - exact), 0.01);
  EXPECT_LT(int4 - exact, 0.05);
  EXPECT_NE(int4, exact);  // the experts really changed
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
