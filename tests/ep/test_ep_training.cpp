// Whole training steps with expert and data parallelism over the job's ranks
// against the same run on one rank (grad_accum micro-batches one after
// another): every step's loss, grad norm, every gradient this rank holds and
// every weight after the update, bitwise; full fine-tuning and LoRA (on the
// attention, or on the experts too), absorbed scores and not, f64, f32 and bf16,
// under remat, with a device tier (the CPU backend) on every rank, and on
// SFT rows (packed, or padded).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/testing.h"
#include "common/tier_runs.h"
#include "ep/ep_env.h"
#include "tiermoe/train/tier_session.h"
#include "tiermoe/train/trainer_config.h"

namespace tiermoe {
namespace {

using testing::all_ranks;
using testing::bitwise_equal;
using testing::ep_comm;

struct Case {
  const char* name;
  DType dtype;
  const char* lora_targets;  // nullptr: full fine-tuning
  const char* absorb;
  const char* remat;
  bool device_tier;
  const char* sft_data = nullptr;  // under tests/data: SFT JSON Lines instead of the corpus
  bool pack = true;
  const char* preset = "tiny";
};

TrainConfig tiny_run(const Case& k) {
  TrainConfig c;
  c.preset = k.preset;
  c.dtype = k.dtype;
  c.seed = 5;
  c.corpus_tokens = 4096;
  c.absorb = k.absorb;
  c.remat = k.remat;
  c.trainer.steps = 3;
  c.trainer.batch = 2;
  c.trainer.seq_len = 16;
  c.trainer.grad_accum = 2 * ep_comm().size();  // two passes on every rank
  c.trainer.schedule.base_lr = 1e-2;
  c.trainer.schedule.warmup_steps = 0;
  c.trainer.max_grad_norm = 0.5;  // clips: the norm must agree for the update to
  if (k.sft_data) {
    c.data_file = std::string(TIERMOE_TEST_DATA_DIR) + "/" + k.sft_data;
    c.pack = k.pack;
  }
  if (k.lora_targets) {
    LoraConfig l;
    l.targets = parse_lora_targets(k.lora_targets);
    c.lora = l;
  }
  c.trainer.data_seed = c.seed;
  return c;
}

std::map<std::string, const Parameter*> by_name(const std::vector<Parameter>& params) {
  std::map<std::string, const Parameter*> m;
  for (const Parameter& p : params) m[p.name] = &p;
  return m;
}

class EpTraining : public ::testing::TestWithParam<Case> {};

TEST_P(EpTraining, StepsEqualOneRankBitwise) {
  const Case& k = GetParam();
  Comm& comm = ep_comm();
  const TrainConfig config = tiny_run(k);
  config.validate();
  const std::unique_ptr<RowSource> data = build_data(config, preset(config.preset));

  CausalLM one = build_model(config);
  Trainer one_trainer(one, *data, config.trainer);
  CausalLM ep = build_model(config, &comm);
  ASSERT_EQ(ep.ep_ranks(), comm.size());
  std::unique_ptr<TierSession> tier;
  if (k.device_tier) {
    tier = std::make_unique<TierSession>(
        // Some of this rank's rows on the CPU device, the rest on the host.
        testing::small_device_tier(config, "cpu", 3, "device"), ep, !config.lora, nullptr);
  }
  Trainer ep_trainer(ep, *data, config.trainer);

  const auto want = by_name(one_trainer.parameters());
  int64_t expert_params = 0, device_rows = 0;
  for (const Parameter& p : ep_trainer.parameters()) expert_params += p.expert >= 0;
  for (int64_t step = 1; step <= config.trainer.steps; ++step) {
    const StepStats a = one_trainer.step();
    const StepStats b = ep_trainer.step();
    EXPECT_EQ(a.loss, b.loss) << "step " << step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    EXPECT_EQ(a.tokens, b.tokens);
    if (b.tier) device_rows += b.tier->total.device_rows;
    bool ok = true;
    for (const Parameter& p : ep_trainer.parameters()) {
      ASSERT_TRUE(want.contains(p.name)) << p.name;
      const Parameter& q = *want.at(p.name);
      ok &= bool(bitwise_equal(p.grad, q.grad, p.name + " grad, step " + std::to_string(step)));
      ok &= bool(bitwise_equal(p.value, q.value, p.name + " after step " + std::to_string(step)));
      EXPECT_TRUE(bitwise_equal(p.grad, q.grad, p.name + " grad"));
      EXPECT_TRUE(bitwise_equal(p.value, q.value, p.name));
    }
    EXPECT_TRUE(all_ranks(ok)) << "step " << step;
  }
  // This rank holds its share of the experts' parameters and all the others.
  int64_t one_expert_params = 0;
  for (const Parameter& p : one_trainer.parameters()) one_expert_params += p.expert >= 0;
  EXPECT_EQ(expert_params * comm.size(), one_expert_params);
  EXPECT_EQ(ep_trainer.parameters().size() - size_t(expert_params),
            one_trainer.parameters().size() - size_t(one_expert_params));
  if (k.device_tier) {
    EXPECT_GT(device_rows, 0) << "no rows ran on the device tier";
  }
}

INSTANTIATE_TEST_SUITE_P(
    , EpTraining,
    ::testing::Values(
        Case{"f64_full_absorbed", DType::f64, nullptr, "auto", "none", false},
        Case{"f64_full_postcombine", DType::f64, nullptr, "off", "none", false},
        Case{"f32_full_remat", DType::f32, nullptr, "auto", "full", false},
        Case{"f32_lora_attention", DType::f32, "q_proj,v_proj", "auto", "none", false},
        Case{"f64_lora_experts", DType::f64, "q_proj,gate_proj,up_proj,down_proj", "off", "default",
             false},
        Case{"f64_full_device_tier", DType::f64, nullptr, "auto", "none", true},
        Case{"f32_full_device_tier", DType::f32, nullptr, "auto", "none", true},
        Case{"bf16_full_device_tier", DType::bf16, nullptr, "auto", "default", true},
        Case{"f64_lora_device_tier", DType::f64, "q_proj,k_proj,v_proj,o_proj", "off", "full",
             true},
        Case{"f32_full_sft_packed", DType::f32, nullptr, "auto", "none", false,
             "model/sft/data.jsonl", true},
        Case{"f64_lora_sft_padded", DType::f64, "q_proj,gate_proj", "off", "none", false,
             "model/sft/data.jsonl", false},
        // Qwen2-MoE: the shared expert is replicated like attention.
        Case{"qwen2_f64_full_remat", DType::f64, nullptr, "auto", "full", false, nullptr, true,
             "tiny-qwen2-moe"},
        Case{"qwen2_f32_lora_experts_and_shared", DType::f32, "q_proj,gate_proj,up_proj,down_proj",
             "off", "default", false, nullptr, true, "tiny-qwen2-moe"},
        // GLM-4.5: the sigmoid group router, a dense first layer.
        Case{"glm4_f64_full_device_tier", DType::f64, nullptr, "auto", "none", true, nullptr, true,
             "tiny-glm4-moe"},
        Case{"glm4_f32_lora_shared_experts", DType::f32,
             "q_proj,shared_experts.gate_proj,shared_experts.up_proj", "off", "full", false,
             nullptr, true, "tiny-glm4-moe"},
        // DeepSeek-V3: latent attention replicated like any attention, its
        // q latent's norm among the replicated weights.
        Case{"deepseek_v3_f64_full_device_tier", DType::f64, nullptr, "auto", "none", true, nullptr,
             true, "tiny-deepseek-v3"},
        Case{"deepseek_v3_f32_lora_latent_attention", DType::f32,
             "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj", "off", "full", false, nullptr,
             true, "tiny-deepseek-v3"},
        // GLM-4.7-Flash: DeepSeek-V3's model under its own family spec.
        Case{"glm4_moe_lite_f64_full_device_tier", DType::f64, nullptr, "auto", "none", true,
             nullptr, true, "tiny-glm4-moe-lite"},
        // DeepSeek-V2: V3's attention under the softmax group-limited router.
        Case{"deepseek_v2_f64_full_device_tier", DType::f64, nullptr, "auto", "none", true, nullptr,
             true, "tiny-deepseek-v2"},
        // MiniMax-M2: the sigmoid router's bias on the block, whole-projection q/k norm.
        Case{"minimax_m2_f32_lora_device_tier", DType::f32, "q_proj,k_proj,v_proj,o_proj", "auto",
             "default", true, nullptr, true, "tiny-minimax-m2"},
        // Qwen3.5-MoE: Gated DeltaNet and gated attention replicated like
        // any attention, the gated shared expert beside the routed ones.
        Case{"qwen3_5_moe_f32_lora_device_tier", DType::f32,
             "q_proj,v_proj,in_proj_qkv,in_proj_z,out_proj", "auto", "default", true, nullptr, true,
             "tiny-qwen3.5-moe"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace tiermoe
