// The run-defining settings are declared once (train/run_fields.h): every
// flag the list names is an option of `tiermoe train`, every setting away
// from its default survives trainer_state.json, and a checkpoint written
// before a field existed reads with the value the list says it meant.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <memory>

#include "tiermoe/train/run_fields.h"

namespace tiermoe {
namespace {

std::string train_help() {
  const std::string cmd = std::string("'") + TIERMOE_CLI_PATH + "' train --help 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  std::array<char, 4096> buf;
  while (pipe && fgets(buf.data(), int(buf.size()), pipe.get())) out += buf.data();
  return out;
}

TEST(RunFields, EveryFlagIsATrainOption) {
  const std::string help = train_help();
  ASSERT_NE(help.find("--model"), std::string::npos) << help;
  for (const RunField& f : run_fields()) {
    ASSERT_FALSE(f.flags.empty()) << f.key;
    for (const std::string& flag : f.flags) {
      EXPECT_NE(help.find(flag + " "), std::string::npos) << f.key << ": " << flag;
    }
  }
}

TEST(RunFields, EverySettingSurvivesTheCheckpointConfig) {
  TrainConfig c;
  c.model_dir = "m";
  c.preset = "small";
  c.layers = 3;
  c.dtype = DType::bf16;
  c.seed = 7;
  c.data_file = "d.jsonl";
  c.pack = false;
  c.lm_head_chunk = 64;
  c.corpus_tokens = 4096;
  c.remat = "full";
  c.absorb = "off";
  c.lora = LoraConfig{};
  c.lora->rank = 4;
  c.lora->alpha = 3;
  c.lora->rslora = true;
  c.lora->targets = {"q_proj"};
  c.lora->layers = {1};
  c.lora_init = "adapter";
  c.experts = QuantFormat::int8;
  c.experts_group = 32;
  TrainerOptions& t = c.trainer;
  t.steps = 9, t.batch = 3, t.seq_len = 17, t.grad_accum = 2, t.max_grad_norm = 0.5;
  t.optimizer = OptimizerKind::sgd;
  t.schedule.base_lr = 0.25, t.schedule.kind = LrScheduleKind::constant;
  t.schedule.warmup_steps = 2, t.schedule.min_lr_ratio = 0.3;
  t.adamw.weight_decay = t.sgd.weight_decay = 0.01;
  t.adamw.beta1 = 0.8, t.adamw.beta2 = 0.9, t.adamw.eps = 1e-6, t.sgd.momentum = 0.7;
  t.shuffle = false;
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j.size(), run_fields().size());
  const TrainConfig back = TrainConfig::from_json(j, "test");
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.trainer.data_seed, 7u);
  EXPECT_EQ(back.trainer.sgd.weight_decay, 0.01);
}

TEST(RunFields, OldCheckpointsReadWithTheValuesTheyMeant) {
  nlohmann::json j = TrainConfig{}.to_json();
  int optional = 0;
  for (const RunField& f : run_fields()) {
    if (!f.absent) continue;
    ++optional;
    j.erase(f.key);
  }
  EXPECT_EQ(optional, 5);  // pack, lm_head_chunk, experts, experts_group, dequantize
  EXPECT_EQ(TrainConfig::from_json(j, "old").to_json(), TrainConfig{}.to_json());
  j.erase("steps");  // a required one
  EXPECT_THROW(TrainConfig::from_json(j, "old"), Error);
}

}  // namespace
}  // namespace tiermoe
