// Trainer: gradient accumulation equals one big batch, bitwise resume
// (full fine-tuning in f32 and bf16), checkpoints complete and atomic, the
// NaN guard leaves the last checkpoint intact, bad input before any step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/test_dir.h"
#include "common/testing.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/train/checkpoint.h"
#include "tiermoe/train/sft_data.h"
#include "tiermoe/train/trainer_session.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;
using ::tiermoe::testing::all_close;
using ::tiermoe::testing::bitwise_equal;

// The tiny preset cut to one layer, on a short built-in corpus sample: a
// few milliseconds a step.
TrainConfig small_run(DType dtype, int64_t steps) {
  TrainConfig c;
  c.preset = "tiny";
  c.layers = 1;
  c.dtype = dtype;
  c.seed = 7;
  c.corpus_tokens = 4096;
  c.trainer.steps = steps;
  c.trainer.batch = 2;
  c.trainer.seq_len = 16;
  c.trainer.schedule.base_lr = 3e-3;
  c.trainer.schedule.warmup_steps = steps >= 4 ? 2 : 0;
  c.trainer.schedule.min_lr_ratio = 0.1;
  c.trainer.data_seed = c.seed;
  return c;
}

class TrainerTest : public testing::DirTest {
 protected:
  TrainerTest() : DirTest("tiermoe_test_trainer_", 1) {}
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Every file under `dir`, by relative path, with its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = slurp(e.path());
  }
  return files;
}

void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const SafetensorsFile fa = SafetensorsFile::open(a.string());
  const SafetensorsFile fb = SafetensorsFile::open(b.string());
  ASSERT_EQ(fa.entries().size(), fb.entries().size()) << a << " vs " << b;
  for (const SafetensorsEntry& e : fa.entries()) {
    EXPECT_TRUE(bitwise_equal(fb.view(e.name), fa.view(e.name), e.name));
  }
}

TEST_F(TrainerTest, AccumulatingTwoMicroBatchesEqualsOneBatchOfTwiceTheSize) {
  TrainConfig c = small_run(DType::f64, 1);
  c.trainer.shuffle = false;  // both walks take the same four windows in order
  TrainConfig big = c;
  c.trainer.batch = 2;
  c.trainer.grad_accum = 2;
  big.trainer.batch = 4;

  CausalLM m_acc = build_model(c), m_big = build_model(big);
  const auto rows = build_data(c, m_acc.config());
  const RowSource& data = *rows;
  Trainer acc(m_acc, data, c.trainer), one(m_big, data, big.trainer);
  const StepStats s_acc = acc.accumulate_gradients();
  const StepStats s_big = one.accumulate_gradients();
  EXPECT_NEAR(s_acc.loss, s_big.loss, 1e-13 * std::abs(s_big.loss));
  EXPECT_EQ(s_acc.tokens, s_big.tokens);
  ASSERT_EQ(acc.parameters().size(), one.parameters().size());
  for (size_t i = 0; i < acc.parameters().size(); ++i) {
    const Parameter& p = acc.parameters()[i];
    EXPECT_TRUE(all_close(p.grad, one.parameters()[i].grad, 1e-11, 1e-15, p.name));
  }
}

// Padded rows train without their tail (data.h: without_padded_tail): the
// loss and every gradient equal the whole padded batch's, in f64.
TEST_F(TrainerTest, APaddedTailIsSkippedWithTheSameLossAndGradients) {
  TrainConfig c = small_run(DType::f64, 1);
  c.trainer.shuffle = false;
  c.trainer.seq_len = 32;
  std::vector<SftExample> examples;
  for (int e = 0; e < 4; ++e) {
    SftExample ex;
    for (int i = 0; i < 5 + 3 * e; ++i) ex.input_ids.push_back((11 * e + 7 * i) % 256);
    ex.labels = ex.input_ids;
    ex.labels[0] = -100;
    examples.push_back(ex);
  }
  const SftData data(examples, "padded", {.seq_len = 32, .pack = false});
  CausalLM m_train = build_model(c), m_ref = build_model(c);
  Trainer trainer(m_train, data, c.trainer);
  const StepStats s = trainer.accumulate_gradients();

  const TokenBatch whole = data.eval_batch(2, 32);
  ASSERT_LT(without_padded_tail(whole).seq_len, 32) << "the rows must end in padding";
  const double loss = m_ref.forward(whole.inputs_BL, whole.targets_BL, 2, 32, true, whole.layout);
  m_ref.backward();
  EXPECT_NEAR(s.loss, loss, 1e-13 * std::abs(loss));
  std::vector<Parameter> ref = trainable_parameters(m_ref);
  ASSERT_EQ(ref.size(), trainer.parameters().size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const Parameter& p = trainer.parameters()[i];
    EXPECT_TRUE(all_close(p.grad, ref[i].grad, 1e-11, 1e-15, p.name));
  }
}

// Run N steps in one go; run k steps, stop, resume to N: same losses, same
// weights and optimizer state, bit for bit.
void check_resume_is_bitwise(const fs::path& dir, DType dtype, bool lora = false) {
  const int64_t steps = 6;
  TrainConfig c = small_run(dtype, steps);
  if (lora) {
    LoraConfig l;
    l.rank = 4;
    l.alpha = 8;
    l.targets = {"q_proj", "v_proj", "gate_proj", "down_proj"};  // attention and every expert
    c.lora = l;
  }
  const std::string weights = lora ? "adapter_model.safetensors" : "model.safetensors";
  const std::string exported = lora ? "adapter" : "final";

  RunControl straight{.out_dir = (dir / "straight").string()};
  const TrainSummary a = run_training(c, straight);

  RunControl first{.out_dir = (dir / "split").string(), .save_every = 2, .stop_after = 3};
  const TrainSummary b1 = run_training(c, first);
  EXPECT_EQ(b1.steps, 3);
  EXPECT_TRUE(fs::exists(dir / "split" / "checkpoint-2"));
  EXPECT_TRUE(fs::exists(dir / "split" / "checkpoint-3"));
  EXPECT_FALSE(fs::exists(dir / "split" / exported)) << "a stopped run exports nothing";
  EXPECT_TRUE(fs::exists(dir / "split" / "checkpoint-3" / weights));
  EXPECT_EQ(fs::exists(dir / "split" / "checkpoint-3" / "model.safetensors"), !lora)
      << "a LoRA checkpoint holds the adapter only";

  RunControl second{.out_dir = (dir / "split").string(),
                    .resume = resolve_checkpoint((dir / "split").string())};
  EXPECT_EQ(second.resume, (dir / "split" / "checkpoint-3").string());
  const TrainSummary b2 = run_training(c, second);

  ASSERT_EQ(a.losses.size(), size_t(steps));
  ASSERT_EQ(b2.losses.size(), size_t(steps));
  for (int64_t i = 0; i < steps; ++i) {
    EXPECT_EQ(a.losses[i], b2.losses[i]) << "step " << i + 1;
    if (i < 3) {
      EXPECT_EQ(a.losses[i], b1.losses[i]) << "step " << i + 1;
    }
  }
  expect_same_tensors(dir / "straight" / exported / weights, dir / "split" / exported / weights);
  expect_same_tensors(dir / "straight" / "checkpoint-6" / weights,
                      dir / "split" / "checkpoint-6" / weights);
  expect_same_tensors(dir / "straight" / "checkpoint-6" / kOptimizerStateFile,
                      dir / "split" / "checkpoint-6" / kOptimizerStateFile);
  // The run trained: the loss fell (full), the zero-initialised B moved (LoRA).
  if (!lora) {
    EXPECT_LT(a.losses.back(), a.losses.front());
  } else {
    const SafetensorsFile f =
        SafetensorsFile::open((dir / "straight" / exported / weights).string());
    double sum = 0;
    for (const SafetensorsEntry& e : f.entries()) {
      if (e.name.find("lora_B") == std::string::npos) continue;
      for (double v : f.view(e.name).to_vector()) sum += std::abs(v);
    }
    EXPECT_GT(sum, 0.0);
  }
}

TEST_F(TrainerTest, ResumeIsBitwiseF32) { check_resume_is_bitwise(dir_, DType::f32); }
TEST_F(TrainerTest, ResumeIsBitwiseBf16) { check_resume_is_bitwise(dir_, DType::bf16); }
TEST_F(TrainerTest, ResumeIsBitwiseLoraF32) { check_resume_is_bitwise(dir_, DType::f32, true); }
TEST_F(TrainerTest, ResumeIsBitwiseLoraBf16) { check_resume_is_bitwise(dir_, DType::bf16, true); }

TEST_F(TrainerTest, LoraTrainsOnlyTheAdaptersWithDecayOnEvery) {
  TrainConfig c = small_run(DType::bf16, 1);
  c.lora = LoraConfig{};
  CausalLM model = build_model(c);
  const auto rows = build_data(c, model.config());
  const RowSource& data = *rows;
  Trainer trainer(model, data, c.trainer);
  ASSERT_FALSE(trainer.parameters().empty());
  for (const Parameter& p : trainer.parameters()) {
    EXPECT_TRUE(p.name.find(".lora_A.") != std::string::npos ||
                p.name.find(".lora_B.") != std::string::npos)
        << p.name;
    EXPECT_EQ(p.value.dtype(), DType::f32) << p.name << ": LoRA masters are fp32";
    EXPECT_TRUE(p.weight_decay) << p.name;
  }
}

TEST_F(TrainerTest, FullFineTuningExemptsNormsFromWeightDecay) {
  CausalLM model = build_model(small_run(DType::f32, 1));
  int64_t exempt = 0;
  for (const Parameter& p : trainable_parameters(model)) {
    const bool norm = p.name.find("norm") != std::string::npos;
    EXPECT_EQ(p.weight_decay, !norm) << p.name;
    exempt += !p.weight_decay;
  }
  EXPECT_GT(exempt, 0);
}

TEST_F(TrainerTest, CheckpointIsCompleteAndLeavesNoTemporaryDirectory) {
  const TrainConfig c = small_run(DType::bf16, 2);
  run_training(c, {.out_dir = dir_.string(), .save_every = 1});
  std::set<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir_)) entries.insert(e.path().filename().string());
  EXPECT_EQ(entries, (std::set<std::string>{"checkpoint-1", "checkpoint-2", "final"}));
  const fs::path ck = dir_ / "checkpoint-2";
  for (const char* f :
       {"config.json", "model.safetensors", kOptimizerStateFile, kTrainerStateFile}) {
    EXPECT_TRUE(fs::is_regular_file(ck / f)) << f;
  }
  // bf16 weights keep their fp32 masters in the optimizer state.
  const SafetensorsFile opt = SafetensorsFile::open((ck / kOptimizerStateFile).string());
  EXPECT_TRUE(opt.contains("model.norm.weight.master"));
  EXPECT_TRUE(opt.contains("model.norm.weight.exp_avg"));
  const TrainCheckpoint back = read_train_checkpoint(ck.string());
  EXPECT_EQ(back.state.step, 2);
  EXPECT_EQ(back.state.losses.size(), 2u);
  EXPECT_EQ(back.config.to_json(), c.to_json());
}

TEST_F(TrainerTest, WriteDirAtomicallyLeavesTheOldDirectoryOnFailure) {
  const fs::path target = dir_ / "checkpoint-1";
  write_dir_atomically(target.string(),
                       [](const std::string& tmp) { std::ofstream(fs::path(tmp) / "a") << "old"; });
  EXPECT_THROW(write_dir_atomically(target.string(),
                                    [](const std::string& tmp) {
                                      std::ofstream(fs::path(tmp) / "a") << "new";
                                      throw Error("disk full");
                                    }),
               Error);
  EXPECT_EQ(slurp(target / "a"), "old");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  write_dir_atomically(target.string(),
                       [](const std::string& tmp) { std::ofstream(fs::path(tmp) / "b") << "new"; });
  EXPECT_FALSE(fs::exists(target / "a")) << "a replaced directory keeps none of the old files";
  EXPECT_EQ(slurp(target / "b"), "new");
}

TEST_F(TrainerTest, NanWeightStopsTrainingNamingTheLayerAndKeepsTheLastCheckpoint) {
  const TrainConfig c = small_run(DType::f32, 4);
  CausalLM model = build_model(c);
  const auto rows = build_data(c, model.config());
  const RowSource& data = *rows;
  Trainer trainer(model, data, c.trainer);
  trainer.step();
  const std::string ck = save_train_checkpoint(dir_.string(), model, trainer, c);
  const auto before = snapshot(dir_);

  for (ModelParam& p : model.params()) {
    if (p.name == "model.layers.0.self_attn.o_proj.weight") p.value.set(3, std::nan(""));
  }
  try {
    trainer.step();
    FAIL() << "a NaN weight must stop training";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(trainer.steps_done(), 1);
  EXPECT_EQ(snapshot(dir_), before);
}

TEST_F(TrainerTest, BadInputFailsBeforeAnyStep) {
  // A token outside the vocabulary, naming the file.
  const fs::path bad = dir_ / "bad.npy";
  std::vector<int32_t> tokens(100, 3);
  tokens[42] = 256;
  write_npy_tokens(bad.string(), tokens, TokenDType::i32);
  TrainConfig c = small_run(DType::f32, 2);
  c.data_file = bad.string();
  EXPECT_THROW(run_training(c, {}), Error);

  // Data shorter than one window.
  const fs::path shortf = dir_ / "short.npy";
  write_npy_tokens(shortf.string(), std::vector<int32_t>(16, 1), TokenDType::i32);
  c.data_file = shortf.string();
  try {
    run_training(c, {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one window"), std::string::npos) << e.what();
  }

  // An unknown remat region.
  TrainConfig r = small_run(DType::f32, 2);
  r.remat = "save:w13,bogus";
  EXPECT_THROW(run_training(r, {}), Error);

  // --out holding checkpoints of another run, without --resume.
  const TrainConfig ok = small_run(DType::f32, 1);
  run_training(ok, {.out_dir = dir_.string()});
  EXPECT_THROW(run_training(ok, {.out_dir = dir_.string()}), Error);

  // Resuming with a different flag.
  TrainConfig other = ok;
  other.trainer.schedule.base_lr = 1e-2;
  try {
    run_training(other, {.resume = resolve_checkpoint(dir_.string())});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lr"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tiermoe
