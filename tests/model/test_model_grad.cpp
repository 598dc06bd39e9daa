// The whole model's gradients against f64 central finite differences, for
// every parameter kind, and the parameter list against the HF tensor list.
#include <cstdio>
#include <map>

#include "model/model_rig.h"

namespace tiermoe {
namespace {

using testing::Family;

// "model.layers.2.mlp.experts.3.up_proj.weight" -> "mlp.experts.up_proj.weight"
std::string kind_of(const std::string& name) {
  std::string k = name;
  if (k.starts_with("model.layers.")) k = k.substr(k.find('.', 13) + 1);
  // Per-expert names only (not shared_experts., nor gpt-oss's fused experts.gate_up_proj).
  if (size_t e = k.find(".experts."); e != std::string::npos && std::isdigit(k[e + 9])) {
    size_t dot = k.find('.', e + 9);
    k = k.substr(0, e + 9) + k.substr(dot + 1);
  }
  return k;
}

void check_model_fd(const ModelConfig& config, uint64_t seed) {
  testing::SingleThread one_thread;
  CausalLM model(config, DType::f64);
  testing::randomize(model, seed);
  testing::Batch batch = testing::make_batch(config.vocab_size, seed + 1);
  auto loss = [&]() { return model.forward(batch.ids, batch.targets, batch.B, batch.T, false); };

  model.zero_grad();
  const double l0 = model.forward(batch.ids, batch.targets, batch.B, batch.T);
  model.backward();
  ASSERT_EQ(model.last_loss().aux_in_total, config.output_router_logits);
  if (config.output_router_logits) {
    EXPECT_NE(l0, model.last_loss().ce) << "the aux loss must be part of the loss";
  }

  // Group the parameters by kind; sample 24 elements of each kind.
  std::vector<ModelParam> params = model.params();
  std::map<std::string, std::vector<size_t>> kinds;
  for (size_t i = 0; i < params.size(); ++i) kinds[kind_of(params[i].name)].push_back(i);
  Rng rng(seed + 2);
  for (const auto& [kind, members] : kinds) {
    double worst = 0;
    if (kind == "mlp.gate.e_score_correction_bias") {  // selects only: no gradient
      for (size_t i : members) EXPECT_FALSE(params[i].requires_grad) << params[i].name;
      continue;
    }
    for (int s = 0; s < 24; ++s) {
      ModelParam& p = params[members[rng.below(members.size())]];
      ASSERT_TRUE(p.grad.defined()) << p.name;
      const int64_t i = int64_t(rng.below(uint64_t(p.value.numel())));
      const double fd = testing::fd_derivative(loss, p.value, i);
      const double an = p.grad.get(i);
      worst = std::max(worst, std::abs(fd - an));
      EXPECT_NEAR(an, fd, 1e-9 + 1e-6 * std::abs(fd)) << p.name << "[" << i << "]";
    }
    std::printf("  %-36s worst |fd - analytic| %.2e\n", kind.c_str(), worst);
  }
  // Each kind the config implies was sampled.
  std::vector<std::string> want = {"model.embed_tokens.weight", "self_attn.o_proj.weight",
                                   "input_layernorm.weight", "post_attention_layernorm.weight",
                                   "model.norm.weight"};
  const std::vector<std::string> attention_kinds =
      !config.mla() ? std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight"}
      : config.q_lora_rank > 0
          ? std::vector<std::string>{"q_a_proj.weight",       "q_a_layernorm.weight",
                                     "q_b_proj.weight",       "kv_a_proj_with_mqa.weight",
                                     "kv_a_layernorm.weight", "kv_b_proj.weight"}
          : std::vector<std::string>{"q_proj.weight", "kv_a_proj_with_mqa.weight",
                                     "kv_a_layernorm.weight", "kv_b_proj.weight"};
  for (const std::string& k : attention_kinds) want.push_back("self_attn." + k);
  if (config.mla() && config.attention_bias) {
    for (const char* k : {"self_attn.kv_a_proj_with_mqa.bias", "self_attn.o_proj.bias"}) {
      want.push_back(k);
    }
    if (config.q_lora_rank > 0) want.push_back("self_attn.q_a_proj.bias");
  }
  const std::string block = config.family == ModelFamily::mixtral ? "block_sparse_moe." : "mlp.";
  const std::vector<std::string> moe_kinds =
      config.family == ModelFamily::gpt_oss
          ? std::vector<std::string>{"router.weight",        "router.bias",
                                     "experts.gate_up_proj", "experts.gate_up_proj_bias",
                                     "experts.down_proj",    "experts.down_proj_bias"}
          : std::vector<std::string>{"gate.weight", "experts.gate_proj.weight",
                                     "experts.up_proj.weight", "experts.down_proj.weight"};
  if (config.family == ModelFamily::gpt_oss) want.push_back("self_attn.sinks");
  for (std::string k : moe_kinds) {
    if (config.family == ModelFamily::mixtral) {
      if (k.starts_with("experts.")) k = k.substr(0, 8) + (k[8] == 'g' ? "w1" : k[8] == 'u' ? "w3" : "w2") + ".weight";
    }
    want.push_back(block + k);
  }
  if (!config.mlp_only_layers.empty() || config.first_k_dense_replace > 0) {
    for (const char* k : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
      want.push_back(k);
    }
  }
  if (config.has_shared_expert()) {
    const std::string se = "mlp." + std::string(config.spec().shared_expert) + ".";
    for (const char* k : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
      want.push_back(se + k);
    }
    if (config.shared_expert_gated()) want.push_back("mlp.shared_expert_gate.weight");
  }
  if (!config.mla() && config.q_k_v_bias()) {
    for (const char* k :
         {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) {
      want.push_back(k);
    }
  }
  EXPECT_EQ(kinds.count("self_attn.o_proj.bias"), config.attention_bias ? 1u : 0u);
  for (const auto& k : want) EXPECT_TRUE(kinds.count(k)) << k;
  EXPECT_EQ(kinds.count("lm_head.weight"), config.tie_word_embeddings ? 0u : 1u);
  EXPECT_EQ(kinds.count("self_attn.q_norm.weight"), config.qk_norm() == QkNorm::none ? 0u : 1u);
}

TEST(ModelGrad, Qwen3UntiedRenormalisedMatchesFiniteDifferences) {
  check_model_fd(testing::tiny_model_config(Family::qwen3, false, true), 11);
}

TEST(ModelGrad, Qwen3TiedNotRenormalisedWithBiasMatchesFiniteDifferences) {
  check_model_fd(testing::tiny_model_config(Family::qwen3, true, false, true), 12);
}

TEST(ModelGrad, OlmoeWholeQkNormMatchesFiniteDifferences) {
  check_model_fd(testing::tiny_model_config(Family::olmoe, false, false), 13);
}

TEST(ModelGrad, MixtralMatchesFiniteDifferences) {
  check_model_fd(testing::tiny_model_config(Family::mixtral, false, false), 14);
}

TEST(ModelGrad, Qwen2SharedExpertQkvBiasMatchesFiniteDifferences) {
  check_model_fd(testing::tiny_model_config(Family::qwen2, false, false, true), 15);
}

TEST(ModelGrad, Glm4SigmoidGroupRouterSharedExpertsPartialRotaryMatchesFiniteDifferences) {
  check_model_fd(testing::tiny_model_config(Family::glm4, false, true, true), 16);
}

TEST(ModelGrad, GptOssSinksWindowBiasedRouterAndExpertsMatchFiniteDifferences) {
  check_model_fd(testing::tiny_model_config(Family::gpt_oss, false, false), 17);
}

TEST(ModelGrad, DeepseekV3LatentAttentionInterleavedRopeYarnMatchesFiniteDifferences) {
  check_model_fd(testing::tiny_model_config(Family::deepseek_v3, false, true, true), 18);
}

// MLA's other form: q_proj straight from the hidden state, rope dims in rotate-half order.
TEST(ModelGrad, DeepseekV3WithoutQLatentMatchesFiniteDifferences) {
  ModelConfig c = testing::tiny_model_config(Family::deepseek_v3, true, false);
  c.q_lora_rank = 0;
  c.rope_interleave = false;
  check_model_fd(c, 19);
}

// params() lists the checkpoint's tensors in order, by name, role and shape
// (a gpt-oss expert matrix as the transpose of its x-major checkpoint shape).
TEST(ModelParams, NamesAndShapesAreTheCheckpointList) {
  for (Family f : {Family::qwen3, Family::olmoe, Family::mixtral, Family::qwen2, Family::glm4,
                   Family::gpt_oss, Family::deepseek_v3}) {
    for (bool tied : {false, true}) {
      ModelConfig c = testing::tiny_model_config(f, tied, true, tied);
      CausalLM model(c, DType::f32);
      std::vector<ModelParam> params = model.params();
      std::vector<HfTensor> want = hf_tensors(c);
      ASSERT_EQ(params.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(params[i].name, want[i].name);
        Shape shape = want[i].shape;
        if (params[i].hf_transposed) std::swap(shape[1], shape[2]);
        EXPECT_EQ(params[i].hf_transposed, f == Family::gpt_oss && want[i].role == HfRole::expert);
        EXPECT_EQ(params[i].value.shape(), shape) << want[i].name;
        EXPECT_EQ(params[i].role, want[i].role) << want[i].name;
        if (want[i].name.ends_with("e_score_correction_bias")) {  // selects only: never trained
          EXPECT_FALSE(params[i].requires_grad);
          continue;
        }
        ASSERT_TRUE(params[i].grad.defined()) << want[i].name;
        EXPECT_EQ(params[i].grad.shape(), shape) << want[i].name;
        EXPECT_EQ(params[i].grad.dtype(), DType::f32) << want[i].name;
      }
    }
  }
}

// Freezing the experts (and everything but the attention) leaves the
// remaining gradients bitwise unchanged and gives the frozen ones none.
TEST(ModelParams, FrozenParametersHoldNoGradAndChangeNothingElse) {
  testing::SingleThread one_thread;
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  testing::Batch batch = testing::make_batch(c.vocab_size, 5);
  auto run = [&](bool freeze) {
    CausalLM model(c, DType::f32);
    testing::randomize(model, 21);
    if (freeze) {
      model.set_requires_grad_all(false);
      model.set_requires_grad("model.layers.0.self_attn.q_proj.weight", true);
      model.set_requires_grad("model.layers.2.self_attn.q_norm.weight", true);
    }
    model.forward(batch.ids, batch.targets, batch.B, batch.T);
    model.backward();
    std::map<std::string, Tensor> grads;
    for (ModelParam& p : model.params()) {
      EXPECT_EQ(p.grad.defined(), p.requires_grad) << p.name;
      if (p.grad.defined()) grads[p.name] = p.grad.clone();
    }
    return grads;
  };
  auto all = run(false), some = run(true);
  ASSERT_EQ(some.size(), 2u);
  for (const auto& [name, g] : some) EXPECT_TRUE(testing::bitwise_equal(g, all.at(name), name));
}

TEST(ModelParams, GroupsFreezeTogetherAndUnknownNamesAreErrors) {
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  CausalLM model(c, DType::f32);
  model.set_requires_grad("model.layers.1.mlp.up_proj.weight", false);
  model.set_requires_grad("model.layers.0.mlp.experts.2.down_proj.weight", false);
  for (const ModelParam& p : model.params()) {
    bool frozen = p.name.starts_with("model.layers.1.mlp.gate_proj") ||
                  p.name.starts_with("model.layers.1.mlp.up_proj") ||
                  p.name.starts_with("model.layers.0.mlp.experts.");
    EXPECT_EQ(p.requires_grad, !frozen) << p.name;
  }
  EXPECT_THROW(model.set_requires_grad("model.layers.9.mlp.up_proj.weight", false), Error);
}

// Gradients accumulate across backwards until zero_grad.
TEST(ModelParams, GradientsAccumulate) {
  testing::SingleThread one_thread;
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  testing::Batch batch = testing::make_batch(c.vocab_size, 8);
  CausalLM model(c, DType::f64);
  testing::randomize(model, 9);
  model.forward(batch.ids, batch.targets, batch.B, batch.T);
  model.backward();
  std::vector<Tensor> once;
  for (ModelParam& p : model.params()) once.push_back(p.grad.clone());
  model.forward(batch.ids, batch.targets, batch.B, batch.T);
  model.backward();
  std::vector<ModelParam> params = model.params();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor twice = once[i].clone();
    for (int64_t j = 0; j < twice.numel(); ++j) twice.set(j, 2 * twice.get(j));
    EXPECT_TRUE(testing::all_close(params[i].grad, twice, 1e-12, 1e-15, params[i].name));
  }
  model.zero_grad();
  for (ModelParam& p : model.params()) {
    for (int64_t j = 0; j < p.grad.numel(); ++j) ASSERT_EQ(p.grad.get(j), 0.0) << p.name;
  }
  EXPECT_THROW(model.backward(), Error);  // no forward since the last backward
}

// The other tests run on one thread; the result must not depend on it.
TEST(ModelGrad, ThreadCountDoesNotChangeLossOrGradients) {
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  testing::Batch batch = testing::make_batch(c.vocab_size, 23, 4, 8);
  auto run = [&](int threads) {
    set_num_threads(threads);
    CausalLM model(c, DType::bf16);
    testing::randomize(model, 24);
    double loss = model.forward(batch.ids, batch.targets, batch.B, batch.T);
    model.backward();
    std::vector<Tensor> grads;
    for (ModelParam& p : model.params()) grads.push_back(p.grad.clone());
    set_num_threads(0);
    return std::pair{loss, grads};
  };
  auto [l1, g1] = run(1);
  auto [ln, gn] = run(0);
  EXPECT_EQ(l1, ln);
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_TRUE(testing::bitwise_equal(gn[i], g1[i]));
}

// HF's nn.Embedding(padding_idx = pad_token_id): the lookup adds nothing to
// the pad row's gradient; a tied lm_head still does.
TEST(ModelGrad, PadRowGetsNoGradientFromTheLookup) {
  testing::SingleThread one_thread;
  for (bool tied : {false, true}) {
    ModelConfig c = testing::tiny_model_config(Family::qwen3, tied, true);
    testing::Batch batch = testing::make_batch(c.vocab_size, 17);
    const int32_t pad = batch.ids[3];
    auto pad_row = [&](bool with_pad) {
      ModelConfig cc = c;
      if (with_pad) cc.pad_token_id = pad;
      CausalLM model(cc, DType::f64);
      testing::randomize(model, 18);
      model.forward(batch.ids, batch.targets, batch.B, batch.T);
      model.backward();
      return model.params().front().grad.rows(pad, pad + 1).clone();
    };
    Tensor with = pad_row(true), without = pad_row(false);
    double with_max = 0, without_max = 0;
    for (int64_t i = 0; i < with.numel(); ++i) {
      with_max = std::max(with_max, std::abs(with.get(i)));
      without_max = std::max(without_max, std::abs(without.get(i)));
    }
    EXPECT_GT(without_max, 0.0);
    if (tied) {
      EXPECT_GT(with_max, 0.0) << "the tied lm_head still reaches the pad row";
      EXPECT_FALSE(testing::bitwise_equal(with, without, "pad row"));
    } else {
      EXPECT_EQ(with_max, 0.0);
    }
  }
}

}  // namespace
}  // namespace tiermoe
