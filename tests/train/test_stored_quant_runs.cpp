// Runs over checkpoints shipped at low width (io/stored_quant.h; the int4
// and FP8 family fixtures): LoRA keeps their routed experts at that width
// and learns; full fine-tuning is refused unless --dequantize asks for
// widened copies, which then train; quantizing stored experts again is
// refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/test_dir.h"
#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/model/causal_lm.h"
#include "tiermoe/train/trainer.h"
#include "tiermoe/train/trainer_config.h"

namespace tiermoe {
namespace {

using testing::throws_error_with;

class StoredQuantRuns : public testing::DirTest {
 protected:
  StoredQuantRuns() : DirTest("tiermoe_stored_quant_runs_", 1) {}

  // A short run over `family`'s checkpoint on a repeating token pattern.
  TrainConfig run_over(const std::string& family, bool lora) {
    std::vector<int32_t> tokens(4096);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i * 7 % 64);  // vocab 64
    const std::string data = (dir_ / "tokens.npy").string();
    write_npy_tokens(data, tokens, TokenDType::i32);
    TrainConfig c;
    c.model_dir = std::string(TIERMOE_TEST_DATA_DIR) + "/families/" + family;
    c.data_file = data;
    c.dtype = DType::bf16;
    c.seed = 3;
    c.trainer.steps = 30;
    c.trainer.batch = 4;
    c.trainer.seq_len = 16;
    c.trainer.schedule.base_lr = 1e-2;
    c.trainer.schedule.warmup_steps = 2;
    c.trainer.data_seed = c.seed;
    if (lora) {
      c.lora = LoraConfig{};
      c.lora->rank = 8;
      c.lora->alpha = 16;
      c.lora->targets = family == "deepseek_v3_fp8"
                            ? std::set<std::string>{"q_a_proj",  "q_b_proj", "kv_a_proj_with_mqa",
                                                    "kv_b_proj", "o_proj",   "gate_proj",
                                                    "up_proj",   "down_proj"}
                            : std::set<std::string>{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};
    }
    return c;
  }

  // The mean loss of the first and last five steps.
  static std::pair<double, double> first_last(CausalLM& model, const TrainConfig& c) {
    const auto rows = build_data(c, model.config());
    Trainer t(model, *rows, c.trainer);
    double first = 0, last = 0;
    for (int64_t s = 0; s < c.trainer.steps; ++s) {
      const double loss = t.step().loss;
      if (s < 5) first += loss / 5;
      if (s >= c.trainer.steps - 5) last += loss / 5;
    }
    return {first, last};
  }
};

TEST_F(StoredQuantRuns, LoraOverTheStoredExpertsLearns) {
  for (const char* family : {"qwen3_moe_int4", "deepseek_v3_fp8"}) {
    SCOPED_TRACE(family);
    const TrainConfig c = run_over(family, /*lora=*/true);
    CausalLM model = build_model(c);
    EXPECT_GT(model.stored_quant_counts().kept, 0);
    for (int64_t l = 0; l < model.num_layers(); ++l) {
      if (model.layer(l).is_moe()) EXPECT_TRUE(model.layer(l).moe()->experts().quantized());
    }
    const auto [first, last] = first_last(model, c);
    EXPECT_LT(last, first - 0.3) << "LoRA over the stored experts did not learn";
  }
}

TEST_F(StoredQuantRuns, FullFineTuningNeedsDequantize) {
  TrainConfig c = run_over("qwen3_moe_int4", /*lora=*/false);
  EXPECT_TRUE(throws_error_with(
      [&] { build_model(c); }, {"ships its weights at int4 (compressed-tensors)", "--dequantize"}));
  c.dequantize = true;
  CausalLM model = build_model(c);
  EXPECT_EQ(model.stored_quant_counts().kept, 0);
  EXPECT_FALSE(model.layer(0).moe()->experts().quantized());
  const auto [first, last] = first_last(model, c);
  EXPECT_LT(last, first - 0.3);
  // Recorded for --resume.
  EXPECT_TRUE(TrainConfig::from_json(c.to_json(), "test").dequantize);
}

TEST_F(StoredQuantRuns, StoredExpertsAreNotQuantizedAgain) {
  TrainConfig c = run_over("deepseek_v3_fp8", /*lora=*/true);
  c.experts = QuantFormat::int4;
  EXPECT_TRUE(
      throws_error_with([&] { build_model(c); }, {"--experts int4 would quantize experts", "fp8"}));
}

}  // namespace
}  // namespace tiermoe
