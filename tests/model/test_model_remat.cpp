// CausalLM::set_moe_options: the whole model's loss and every gradient are
// bitwise the same under every remat policy, absorbed and not, in full
// fine-tuning and with LoRA on every target (the experts' adapter saves are
// kept or replayed with their regions).
#include "common/testing.h"
#include "model/model_rig.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;
using testing::Family;

struct Run {
  double loss = 0;
  std::vector<std::pair<std::string, Tensor>> grads;
  int64_t w13_replays = 0, w2_replays = 0;  // summed over the MoE layers
};

Run run(CausalLM& model, const testing::Batch& b, const std::string& policy, AbsorbScores absorb) {
  model.set_moe_options(RematPolicy::parse(policy), absorb);
  model.zero_grad();
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    if (MoeBlock* m = model.layer(l).moe()) m->layer().reset_counters();
  }
  Run r;
  r.loss = model.forward(b.ids, b.targets, b.B, b.T);
  model.backward();
  std::vector<ModelParam> ps = model.has_lora() ? model.lora_params() : model.params();
  for (ModelParam& p : ps) {
    if (p.grad.defined()) r.grads.emplace_back(p.name, p.grad.clone());
  }
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    if (MoeBlock* m = model.layer(l).moe()) {
      r.w13_replays += m->layer().counters().replay_count(MoeRegion::w13);
      r.w2_replays += m->layer().counters().replay_count(MoeRegion::w2);
    }
  }
  return r;
}

void expect_policies_bitwise(DType dt, bool lora, Family family = Family::qwen3) {
  testing::SingleThread one_thread;
  CausalLM model(testing::tiny_model_config(family, false, true, family != Family::qwen3), dt);
  testing::randomize(model, 11);
  if (lora) {
    LoraConfig cfg;
    cfg.rank = 2;
    cfg.alpha = 4;
    cfg.targets = lora_default_targets(model.config());  // the attention's (MLA's own)
    if (family != Family::gpt_oss) {  // gpt-oss's experts take no LoRA (yet)
      cfg.targets.insert({"gate_proj", "up_proj", "down_proj"});
    }
    model.enable_lora(cfg, 5);
    Rng rng(6);
    for (ModelParam& p : model.lora_params()) {
      if (p.name.ends_with("lora_B.weight")) fill_normal(p.value, rng, 0.0, 0.3);
    }
  }
  testing::Batch b = testing::make_batch(model.config().vocab_size, 12, 2, 6);
  for (AbsorbScores absorb : {AbsorbScores::on, AbsorbScores::off}) {
    SCOPED_TRACE(std::string(dtype_name(dt)) + (lora ? " lora" : " full") + " absorb " +
                 std::string(absorb_scores_name(absorb)));
    Run want = run(model, b, "none", absorb);
    EXPECT_FALSE(want.grads.empty());
    EXPECT_EQ(want.w13_replays, 0);
    for (const char* policy : {"full", "default", "save-w2-only"}) {
      SCOPED_TRACE(policy);
      Run got = run(model, b, policy, absorb);
      EXPECT_EQ(got.loss, want.loss);
      ASSERT_EQ(got.grads.size(), want.grads.size());
      for (size_t i = 0; i < got.grads.size(); ++i) {
        EXPECT_TRUE(bitwise_equal(got.grads[i].second, want.grads[i].second, got.grads[i].first));
      }
      if (std::string(policy) != "default") {
        EXPECT_GT(got.w13_replays, 0);
      }
      // W2 has a backward reader only through the down adapter (no post-norm here).
      const bool down_adapter = lora && family != Family::gpt_oss;
      EXPECT_EQ(got.w2_replays > 0, down_adapter && std::string(policy) == "full");
    }
  }
}

TEST(ModelRemat, FullFineTuningIsBitwiseUnderEveryPolicyF32) {
  expect_policies_bitwise(DType::f32, false);
}
TEST(ModelRemat, FullFineTuningIsBitwiseUnderEveryPolicyBf16) {
  expect_policies_bitwise(DType::bf16, false);
}
TEST(ModelRemat, LoraIsBitwiseUnderEveryPolicyF32) { expect_policies_bitwise(DType::f32, true); }
TEST(ModelRemat, LoraIsBitwiseUnderEveryPolicyBf16) { expect_policies_bitwise(DType::bf16, true); }
TEST(ModelRemat, Qwen2LoraIsBitwiseUnderEveryPolicyBf16) {
  expect_policies_bitwise(DType::bf16, true, Family::qwen2);
}
TEST(ModelRemat, Glm4FullFineTuningIsBitwiseUnderEveryPolicyF32) {
  expect_policies_bitwise(DType::f32, false, Family::glm4);
}

TEST(ModelRemat, GptOssLoraIsBitwiseUnderEveryPolicyBf16) {
  expect_policies_bitwise(DType::bf16, true, Family::gpt_oss);
}
TEST(ModelRemat, GptOssFullFineTuningIsBitwiseUnderEveryPolicyF32) {
  expect_policies_bitwise(DType::f32, false, Family::gpt_oss);
}

TEST(ModelRemat, DeepseekV3LoraIsBitwiseUnderEveryPolicyBf16) {
  expect_policies_bitwise(DType::bf16, true, Family::deepseek_v3);
}
TEST(ModelRemat, DeepseekV3FullFineTuningIsBitwiseUnderEveryPolicyF32) {
  expect_policies_bitwise(DType::f32, false, Family::deepseek_v3);
}

// The shared expert is the region `shared`: replayed, a forward keeps none of
// its record (at least its MLP's h [N, 2S] and a [N, S] per MoE layer), and
// loss and gradients stay bitwise (expect_policies_bitwise above: `full` and
// `save-w2-only` replay it for Qwen2-MoE, GLM-4.5 and DeepSeek-V3).
TEST(ModelRemat, ReplayingTheSharedExpertKeepsLessAndGivesTheSameBits) {
  testing::SingleThread one_thread;
  for (Family family : {Family::qwen2, Family::glm4}) {  // gated and ungated
    SCOPED_TRACE(family == Family::qwen2 ? "qwen2" : "glm4");
    CausalLM model(testing::tiny_model_config(family, false, true, true), DType::f32);
    testing::randomize(model, 11);
    const testing::Batch b = testing::make_batch(model.config().vocab_size, 12, 2, 6);
    auto kept_after_forward = [&](const char* policy, tiermoe::Run& r) {
      model.set_moe_options(RematPolicy::parse(policy), AbsorbScores::on);
      model.zero_grad();
      const size_t before = MemoryTracker::process().live_total();
      r.loss = model.forward(b.ids, b.targets, b.B, b.T);
      const size_t kept = MemoryTracker::process().live_total() - before;
      model.backward();
      for (ModelParam& p : model.params()) {
        if (p.grad.defined()) r.grads.emplace_back(p.name, p.grad.clone());
      }
      return kept;
    };
    tiermoe::Run warm, keep, replay;
    kept_after_forward("none", warm);  // allocates the gradients
    const size_t kept_all = kept_after_forward("none", keep);
    const size_t kept_replayed =
        kept_after_forward("save:router,dispatch,w13,act,w2,combine", replay);
    const ModelConfig& c = model.config();
    const size_t shared_record = size_t(c.num_moe_layers() * b.B * b.T) * 3 *
                                 size_t(c.shared_expert_intermediate_size) * sizeof(float);
    EXPECT_GE(kept_all, kept_replayed + shared_record);
    EXPECT_EQ(replay.loss, keep.loss);
    ASSERT_EQ(replay.grads.size(), keep.grads.size());
    for (size_t i = 0; i < keep.grads.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(replay.grads[i].second, keep.grads[i].second, keep.grads[i].first));
    }
  }
}

TEST(ModelRemat, OptionsReachEveryMoeBlock) {
  CausalLM model(testing::tiny_model_config(Family::qwen3, false, true), DType::f32);
  model.set_moe_options(RematPolicy::full(), AbsorbScores::off);
  EXPECT_EQ(model.remat_policy().name(), "full");
  EXPECT_EQ(model.absorb_scores(), AbsorbScores::off);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    if (MoeBlock* m = model.layer(l).moe()) {
      ++moe_layers;
      EXPECT_FALSE(m->layer().absorbs_scores());
      EXPECT_FALSE(m->layer().config().keep[MoeRegion::w13]);
    }
  }
  EXPECT_EQ(moe_layers, 2);
}

}  // namespace
}  // namespace tiermoe
