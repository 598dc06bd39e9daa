// LoRA over the whole model: merged weights == adapters, a fresh adapter
// changes nothing, f64 finite differences for attention, dense-MLP and
// expert adapters, frozen bases hold no gradients, and PEFT export/import.
#include <cmath>
#include <map>

#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "model/model_rig.h"

namespace tiermoe {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::Family;
using testing::fd_check;
using testing::TempDir;
using testing::throws_error_with;

const std::set<std::string> kAllTargets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                           "gate_proj", "up_proj", "down_proj"};

LoraConfig lora_config(std::set<std::string> targets = kAllTargets, int64_t rank = 2) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = 3;
  c.targets = std::move(targets);
  return c;
}

CausalLM tiny_model(DType dt, int64_t layers = 3) {
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  c.num_hidden_layers = layers;
  CausalLM model(c, dt);
  testing::randomize(model, 21);
  return model;
}

// A trained-looking adapter: B nonzero, so A and the inputs get gradient.
void randomize_b(CausalLM& model, uint64_t seed, double scale = 0.3) {
  Rng rng(seed);
  for (ModelParam& p : model.lora_params()) {
    if (p.name.ends_with("lora_B.weight")) fill_normal(p.value, rng, 0.0, scale);
  }
}

std::map<std::string, ModelParam> by_name(std::vector<ModelParam> ps) {
  std::map<std::string, ModelParam> out;
  for (ModelParam& p : ps) out.emplace(p.name, std::move(p));
  return out;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.get(i)));
  return m;
}

// ---- forward ----

void expect_merged_matches(DType dt, double loss_rtol, double logits_atol_of_max) {
  SCOPED_TRACE(std::string(dtype_name(dt)));
  testing::SingleThread one_thread;
  testing::Batch b = testing::make_batch(40, 22, 2, 6);
  CausalLM adapted = tiny_model(dt);
  adapted.enable_lora(lora_config(), 3);
  randomize_b(adapted, 4);
  double loss = adapted.forward(b.ids, b.targets, b.B, b.T, false);
  Tensor logits = adapted.logits().clone();

  CausalLM merged = tiny_model(dt);
  std::map<std::string, ModelParam> base = by_name(merged.params());
  std::map<std::string, ModelParam> lora = by_name(adapted.lora_params());
  const double scaling = adapted.lora_config().scaling();
  int64_t modules = 0, experts = 0;
  for (auto& [name, a] : lora) {
    if (!name.ends_with(".lora_A.weight")) continue;
    std::string path = name.substr(0, name.size() - std::string(".lora_A.weight").size());
    lora_merge(base.at(path + ".weight").value, a.value, lora.at(path + ".lora_B.weight").value,
               scaling);
    ++modules;
    experts += path.find(".experts.") != std::string::npos;
  }
  // 3 layers x 4 attention + 3 dense (layer 1) + 2 MoE layers x 4 experts x 3.
  EXPECT_EQ(modules, 12 + 3 + 24);
  EXPECT_EQ(experts, 24);
  double want = merged.forward(b.ids, b.targets, b.B, b.T, false);
  EXPECT_NEAR(loss, want, loss_rtol * std::abs(want));
  EXPECT_TRUE(all_close(logits, merged.logits(), 0, logits_atol_of_max * max_abs(merged.logits()),
                        "logits"));
}

TEST(ModelLora, MergedWeightsEqualAdapters) {
  expect_merged_matches(DType::f64, 1e-12, 1e-12);
  // f32: the two evaluation orders differ by rounding only.
  expect_merged_matches(DType::f32, 1e-5, 1e-5);
  // bf16: the merged weight is rounded to bf16 once (2^-8 relative) and the
  // adapter's branch is added to bf16 outputs; ~3 layers of such rounding.
  expect_merged_matches(DType::bf16, 2e-2, 5e-2);
}

TEST(ModelLora, FreshAdaptersLeaveTheLossBitwiseUnchanged) {
  testing::SingleThread one_thread;
  testing::Batch b = testing::make_batch(40, 23);
  for (DType dt : {DType::f32, DType::bf16}) {
    CausalLM model = tiny_model(dt);
    double before = model.forward(b.ids, b.targets, b.B, b.T, false);
    Tensor logits = model.logits().clone();
    model.enable_lora(lora_config(), 7);
    EXPECT_EQ(model.forward(b.ids, b.targets, b.B, b.T, false), before);
    EXPECT_TRUE(bitwise_equal(model.logits(), logits, "logits"));
  }
}

// ---- backward ----

TEST(ModelLora, FiniteDifferencesForAttentionDenseAndExpertAdapters) {
  testing::SingleThread one_thread;
  testing::Batch b = testing::make_batch(40, 24, 2, 6);
  CausalLM model = tiny_model(DType::f64);
  model.enable_lora(lora_config(), 8);
  randomize_b(model, 9);
  auto loss = [&] { return model.forward(b.ids, b.targets, b.B, b.T, false); };
  model.forward(b.ids, b.targets, b.B, b.T);
  model.backward();
  std::map<std::string, ModelParam> lora = by_name(model.lora_params());
  int64_t checked = 0;
  for (const char* path :
       {"model.layers.0.self_attn.q_proj", "model.layers.2.self_attn.o_proj",
        "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj",
        "model.layers.1.mlp.down_proj", "model.layers.0.mlp.experts.1.gate_proj",
        "model.layers.0.mlp.experts.1.up_proj", "model.layers.2.mlp.experts.3.down_proj"}) {
    for (const char* ab : {".lora_A.weight", ".lora_B.weight"}) {
      ModelParam& p = lora.at(std::string(path) + ab);
      ASSERT_GT(max_abs(p.grad), 0.0) << p.name << " got no gradient";
      EXPECT_TRUE(fd_check(loss, p.value, p.grad, p.name, 1e-6, 1e-9, 6));
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16);
}

TEST(ModelLora, BaseWeightsGetNoGradientAndUnadaptedExpertsRunDxOnly) {
  testing::SingleThread one_thread;
  testing::Batch b = testing::make_batch(40, 25);
  for (const std::set<std::string>& targets :
       {std::set<std::string>{"q_proj", "v_proj"}, kAllTargets}) {
    CausalLM model = tiny_model(DType::f32);
    model.params();  // allocates every base gradient first
    model.enable_lora(lora_config(targets), 1);
    randomize_b(model, 2);
    model.forward(b.ids, b.targets, b.B, b.T);
    model.backward();
    for (const ModelParam& p : model.params()) {
      EXPECT_FALSE(p.requires_grad) << p.name;
      EXPECT_FALSE(p.grad.defined()) << p.name;
    }
    for (int64_t l = 0; l < model.num_layers(); ++l) {
      if (MoeBlock* m = model.layer(l).moe()) {
        EXPECT_FALSE(m->experts().has_grads()) << l;
        EXPECT_EQ(m->lora() != nullptr, targets.contains("gate_proj")) << l;
      }
    }
    int64_t expert_grads = 0;
    for (const ModelParam& p : model.lora_params()) {
      EXPECT_TRUE(p.requires_grad);
      EXPECT_EQ(p.grad.dtype(), DType::f32);
      // An expert no token picked gets none.
      if (p.role == HfRole::expert)
        expert_grads += max_abs(p.grad) > 0;
      else
        EXPECT_GT(max_abs(p.grad), 0.0) << p.name;
    }
    EXPECT_EQ(expert_grads > 0, targets.contains("gate_proj"));
  }
}

TEST(ModelLora, ParamsAreNamedInModuleOrder) {
  CausalLM model = tiny_model(DType::f32);
  model.enable_lora(lora_config({"q_proj", "down_proj"}, 4), 1);
  std::vector<ModelParam> ps = model.lora_params();
  // Layer 0: q, then 4 experts' down; layer 1: q, dense down; layer 2 as layer 0.
  ASSERT_EQ(ps.size(), size_t(2 * (1 + 4 + 1 + 1 + 1 + 4)));
  EXPECT_EQ(ps[0].name, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(ps[0].value.shape(), (Shape{4, 16}));
  EXPECT_EQ(ps[1].name, "model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(ps[1].value.shape(), (Shape{32, 4}));
  EXPECT_EQ(ps[2].name, "model.layers.0.mlp.experts.0.down_proj.lora_A.weight");
  EXPECT_EQ(ps[2].value.shape(), (Shape{4, 12}));
  EXPECT_EQ(ps[12].name, "model.layers.1.mlp.down_proj.lora_A.weight");
  EXPECT_EQ(ps[12].role, HfRole::dense_mlp);
  EXPECT_EQ(max_abs(ps[1].value), 0.0);  // B = 0
  EXPECT_GT(max_abs(ps[0].value), 0.0);
  EXPECT_LE(max_abs(ps[0].value), 1.0 / std::sqrt(16.0));
}

TEST(ModelLora, ConfigurationErrors) {
  CausalLM model = tiny_model(DType::f32);
  EXPECT_FALSE(model.has_lora());
  EXPECT_TRUE(throws_error_with([&] { model.lora_config(); }, {"LoRA is not enabled"}));
  model.enable_lora(lora_config(), 1);
  EXPECT_TRUE(model.has_lora());
  EXPECT_TRUE(throws_error_with([&] { model.enable_lora(lora_config(), 1); }, {"already enabled"}));
  CausalLM mixtral(testing::tiny_model_config(Family::mixtral, false, true), DType::f32);
  EXPECT_TRUE(throws_error_with([&] { mixtral.enable_lora(lora_config({"down_proj"}), 1); },
                                {"Mixtral", "w1"}));
}

// ---- PEFT export and import ----

TEST(ModelLora, PeftExportImportRoundTripsExactly) {
  testing::SingleThread one_thread;
  testing::Batch b = testing::make_batch(40, 26);
  CausalLM model = tiny_model(DType::f32);
  LoraConfig cfg = lora_config();
  cfg.rslora = true;
  model.enable_lora(cfg, 5);
  randomize_b(model, 6);
  const double loss = model.forward(b.ids, b.targets, b.B, b.T, false);
  TempDir dir;
  model.save_lora_adapter(dir.path().string(), DType::f32, "tiny");

  // --lora-init into a model without LoRA: enabled from the adapter's config.
  CausalLM fresh = tiny_model(DType::f32);
  fresh.load_lora_adapter(dir.path().string());
  ASSERT_TRUE(fresh.has_lora());
  EXPECT_EQ(fresh.lora_config().rank, cfg.rank);
  EXPECT_EQ(fresh.lora_config().alpha, cfg.alpha);
  EXPECT_TRUE(fresh.lora_config().rslora);
  EXPECT_EQ(fresh.lora_config().targets, cfg.targets);
  std::vector<ModelParam> want = model.lora_params(), got = fresh.lora_params();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_TRUE(bitwise_equal(got[i].value, want[i].value, got[i].name));
  }
  EXPECT_EQ(fresh.forward(b.ids, b.targets, b.B, b.T, false), loss);

  // Into a model with the same LoRA enabled (another seed): overwritten.
  CausalLM enabled = tiny_model(DType::f32);
  enabled.enable_lora(cfg, 99);
  enabled.load_lora_adapter(dir.path().string());
  EXPECT_EQ(enabled.forward(b.ids, b.targets, b.B, b.T, false), loss);

  // A different enabled LoRA is refused.
  CausalLM other = tiny_model(DType::f32);
  other.enable_lora(lora_config(kAllTargets, 3), 1);
  EXPECT_TRUE(throws_error_with([&] { other.load_lora_adapter(dir.path().string()); },
                                {"adapter r 2", "rank 3"}));
}

TEST(ModelLora, PeftImportRejectsModulesAndShapesTheModelLacks) {
  TempDir dir;
  CausalLM model = tiny_model(DType::f32);
  model.enable_lora(lora_config(), 5);
  model.save_lora_adapter(dir.path().string());

  CausalLM fewer = tiny_model(DType::f32, 2);  // no layer 2
  EXPECT_TRUE(throws_error_with([&] { fewer.load_lora_adapter(dir.path().string()); },
                                {"base_model.model.model.layers.2.", "names no module"}));
  CausalLM more = tiny_model(DType::f32, 4);  // layer 3 not in the adapter
  EXPECT_TRUE(throws_error_with([&] { more.load_lora_adapter(dir.path().string()); },
                                {"lacks", "model.layers.3."}));
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  c.moe_intermediate_size = 10;
  CausalLM narrow(c, DType::f32);
  EXPECT_TRUE(throws_error_with([&] { narrow.load_lora_adapter(dir.path().string()); },
                                {"model.layers.0.mlp.experts.0.", ".weight is", "the model's is"}));
}

}  // namespace
}  // namespace tiermoe
