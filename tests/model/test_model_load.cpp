// Loading Hugging Face checkpoints: the io init's files, per-expert and fused
// layouts (bitwise the same model), Mixtral names, save round trips, and the
// errors a wrong checkpoint gets; then bf16/f32 forwards against f64.
#include <gmock/gmock.h>

#include <filesystem>

#include "model/model_rig.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/model/checkpoint.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;
using testing::Family;
using ::testing::HasSubstr;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() /
               ("tiermoe_model_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The tensors `tiermoe init` would write (hf_names.h init), per-expert layout.
NamedTensors init_tensors(const ModelConfig& c, DType storage, uint64_t seed) {
  NamedTensors out;
  for (const HfTensor& t : hf_tensors(c)) out.emplace_back(t.name, init_hf_tensor(t, c, seed, storage));
  return out;
}

// Like init_tensors, with weights large enough that routing and every path matter.
NamedTensors random_tensors(const ModelConfig& c, DType storage, uint64_t seed) {
  Rng rng(seed);
  NamedTensors out;
  for (const HfTensor& t : hf_tensors(c)) {
    Tensor v = Tensor::empty(t.shape, storage);
    fill_normal(v, rng, t.role == HfRole::norm ? 1.0 : 0.0, t.role == HfRole::norm ? 0.2 : 0.3);
    out.emplace_back(t.name, v);
  }
  return out;
}

void write_checkpoint(const fs::path& dir, const ModelConfig& c, const NamedTensors& tensors) {
  save_checkpoint_tensors(dir.string(), tensors);
  save_model_config(c, (dir / "config.json").string());
}

// The same tensors with each MoE layer's experts fused as transformers v5
// does: gate_up_proj [E, 2F, D] (gate rows first), down_proj [E, D, F];
// Mixtral's router renamed to mlp.gate.
NamedTensors fuse_experts(const ModelConfig& c, const NamedTensors& per_expert) {
  auto find = [&](const std::string& n) -> const Tensor& {
    for (const auto& [name, t] : per_expert) if (name == n) return t;
    throw Error("test: no " + n);
  };
  const bool mixtral = c.family == ModelFamily::mixtral;
  NamedTensors out;
  for (const auto& [name, t] : per_expert) {
    if (name.find(".experts.") == std::string::npos) {
      std::string n = name;
      if (mixtral && n.find("block_sparse_moe.gate") != std::string::npos) {
        n.replace(n.find("block_sparse_moe."), 17, "mlp.");
      }
      out.emplace_back(n, t);
    }
  }
  const int64_t E = c.num_experts, F = c.moe_intermediate_size, D = c.hidden_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string block = p + (mixtral ? "block_sparse_moe" : "mlp") + ".experts.";
    const DType dt = per_expert.front().second.dtype();
    Tensor gu = Tensor::empty({E, 2 * F, D}, dt), down = Tensor::empty({E, D, F}, dt);
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = block + std::to_string(e) + ".";
      Tensor g = gu.select(e);
      g.rows(0, F).copy_from(find(ep + (mixtral ? "w1" : "gate_proj") + ".weight"));
      g.rows(F, 2 * F).copy_from(find(ep + (mixtral ? "w3" : "up_proj") + ".weight"));
      down.select(e).copy_from(find(ep + (mixtral ? "w2" : "down_proj") + ".weight"));
    }
    out.emplace_back(p + "mlp.experts.gate_up_proj", gu);
    out.emplace_back(p + "mlp.experts.down_proj", down);
  }
  return out;
}

std::string error_text(const Error& e) { return e.message() + " | " + e.where() + " | " + e.hint(); }

// Loads `dir` and expects an Error whose text contains every one of `parts`.
void expect_load_error(const fs::path& dir, std::vector<std::string> parts) {
  try {
    CausalLM::from_checkpoint(dir.string(), DType::f64);
    ADD_FAILURE() << "loading " << dir << " did not fail";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_THAT(error_text(e), HasSubstr(p));
  }
}

double loss_of(CausalLM& m, const testing::Batch& b) {
  return m.forward(b.ids, b.targets, b.B, b.T, false);
}

TEST(ModelLoad, InitCheckpointLoadsWithItsValues) {
  testing::SingleThread one_thread;  // tiny shapes
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  fs::path dir = temp_dir("init");
  NamedTensors tensors = init_tensors(c, DType::bf16, 3);
  write_checkpoint(dir, c, tensors);
  CausalLM m = CausalLM::from_checkpoint(dir.string(), DType::f32);
  std::vector<ModelParam> params = m.params();
  ASSERT_EQ(params.size(), tensors.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, tensors[i].first);
    EXPECT_TRUE(testing::bitwise_equal(params[i].value, tensors[i].second.to(DType::f32),
                                       params[i].name));
  }
  testing::Batch b = testing::make_batch(c.vocab_size, 4);
  EXPECT_TRUE(std::isfinite(loss_of(m, b)));
  fs::remove_all(dir);
}

TEST(ModelLoad, PerExpertAndFusedLayoutsGiveBitwiseTheSameLoss) {
  testing::SingleThread one_thread;  // tiny shapes
  for (Family f : {Family::qwen3, Family::mixtral}) {
    ModelConfig c = testing::tiny_model_config(f, false, true);
    NamedTensors tensors = random_tensors(c, DType::bf16, 5);
    fs::path a = temp_dir("per_expert"), b = temp_dir("fused");
    write_checkpoint(a, c, tensors);
    write_checkpoint(b, c, fuse_experts(c, tensors));
    CausalLM ma = CausalLM::from_checkpoint(a.string(), DType::f64);
    CausalLM mb = CausalLM::from_checkpoint(b.string(), DType::f64);
    std::vector<ModelParam> pa = ma.params(), pb = mb.params();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(testing::bitwise_equal(pa[i].value, pb[i].value, pa[i].name));
    }
    testing::Batch batch = testing::make_batch(c.vocab_size, 6);
    const double la = loss_of(ma, batch), lb = loss_of(mb, batch);
    EXPECT_EQ(la, lb) << family_name(c.family);
    EXPECT_TRUE(std::isfinite(la));
    fs::remove_all(a);
    fs::remove_all(b);
  }
}

TEST(ModelLoad, SaveCheckpointRoundTrips) {
  testing::SingleThread one_thread;  // tiny shapes
  ModelConfig c = testing::tiny_model_config(Family::olmoe, true, false, true);
  CausalLM m(c, DType::f64);
  testing::randomize(m, 7);
  fs::path dir = temp_dir("save");
  m.save_checkpoint(dir.string());
  CausalLM back = CausalLM::from_checkpoint(dir.string(), DType::f64);
  testing::Batch batch = testing::make_batch(c.vocab_size, 8);
  EXPECT_EQ(loss_of(m, batch), loss_of(back, batch));
  // The files carry HF names only, in the per-expert layout.
  CheckpointTensors ck = CheckpointTensors::open(dir.string());
  EXPECT_EQ(ck.names().size(), hf_tensors(c).size());
  EXPECT_TRUE(ck.contains("model.layers.0.mlp.experts.3.down_proj.weight"));
  EXPECT_EQ(load_model_config(dir.string()).torch_dtype, "float64");
  fs::remove_all(dir);
}

TEST(ModelLoad, MissingTensorIsAnErrorNamingIt) {
  testing::SingleThread one_thread;  // tiny shapes
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  NamedTensors tensors = init_tensors(c, DType::f32, 1);
  const std::string gone = "model.layers.2.mlp.experts.1.up_proj.weight";
  std::erase_if(tensors, [&](const auto& t) { return t.first == gone; });
  fs::path dir = temp_dir("missing");
  write_checkpoint(dir, c, tensors);
  expect_load_error(dir, {"lacks tensor", gone});
  fs::remove_all(dir);
}

TEST(ModelLoad, WrongShapeIsAnErrorNamingTheTensorAndBothShapes) {
  testing::SingleThread one_thread;  // tiny shapes
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  NamedTensors tensors = init_tensors(c, DType::f32, 1);
  for (auto& [name, t] : tensors) {
    if (name == "model.layers.0.self_attn.k_norm.weight") t = Tensor::zeros({9}, DType::f32);
  }
  fs::path dir = temp_dir("shape");
  write_checkpoint(dir, c, tensors);
  expect_load_error(dir, {"model.layers.0.self_attn.k_norm.weight", "[9]", "[8]"});
  fs::remove_all(dir);
}

TEST(ModelLoad, VocabMismatchIsAnErrorNamingTheEmbedding) {
  testing::SingleThread one_thread;  // tiny shapes
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  fs::path dir = temp_dir("vocab");
  write_checkpoint(dir, c, init_tensors(c, DType::f32, 1));
  ModelConfig wrong = c;
  wrong.vocab_size = 48;
  save_model_config(wrong, (dir / "config.json").string());
  expect_load_error(dir, {"model.embed_tokens.weight", "[40, 16]", "[48, 16]", "vocab_size"});
  fs::remove_all(dir);
}

TEST(ModelLoad, ExtraTensorIsAnErrorNamingIt) {
  testing::SingleThread one_thread;  // tiny shapes
  ModelConfig c = testing::tiny_model_config(Family::qwen3, true, true);
  NamedTensors tensors = init_tensors(c, DType::f32, 1);
  const std::string beyond = "model.layers." + std::to_string(c.num_hidden_layers) +
                             ".input_layernorm.weight";
  tensors.emplace_back(beyond, Tensor::zeros({16}, DType::f32));
  fs::path dir = temp_dir("extra");
  write_checkpoint(dir, c, tensors);
  expect_load_error(dir, {beyond, "num_hidden_layers"});
  // A saved rotary buffer is skipped.
  tensors.pop_back();
  tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", Tensor::zeros({4}, DType::f32));
  write_checkpoint(dir, c, tensors);
  EXPECT_NO_THROW(CausalLM::from_checkpoint(dir.string(), DType::f32));
  fs::remove_all(dir);
}

const Tensor& named(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  throw Error("test: no " + name);
}

// A tied config whose file also stores lm_head.weight, as transformers 5's
// tie_weights reads it: equal values stay tied, other values untie the
// model, lm_head.weight alone feeds the embedding.
TEST(ModelLoad, TiedConfigWithAStoredHeadLoadsAsTransformersDoes) {
  testing::SingleThread one_thread;  // tiny shapes
  ModelConfig tied = testing::tiny_model_config(Family::qwen3, true, true);
  ModelConfig untied = tied;
  untied.tie_word_embeddings = false;
  NamedTensors base = random_tensors(untied, DType::f32, 9);  // with its own lm_head
  const Tensor& embed = named(base, "model.embed_tokens.weight");
  const Tensor& head = named(base, "lm_head.weight");
  testing::Batch batch = testing::make_batch(tied.vocab_size, 6);

  // Equal values (torch .bin checkpoints store both): one tied weight.
  NamedTensors equal = base;
  for (auto& [n, t] : equal) {
    if (n == "lm_head.weight") t = embed.clone();
  }
  fs::path dir = temp_dir("tied_equal");
  write_checkpoint(dir, tied, equal);
  CausalLM m = CausalLM::from_checkpoint(dir.string(), DType::f64);
  EXPECT_TRUE(m.config().tie_word_embeddings);
  std::erase_if(equal, [](const auto& t) { return t.first == "lm_head.weight"; });
  fs::path ref_dir = temp_dir("tied_ref");
  write_checkpoint(ref_dir, tied, equal);
  CausalLM ref = CausalLM::from_checkpoint(ref_dir.string(), DType::f64);
  EXPECT_EQ(m.params().size(), ref.params().size());
  EXPECT_EQ(loss_of(m, batch), loss_of(ref, batch));

  // Other values: untied, each its own, as an untied config of the same file.
  write_checkpoint(dir, tied, base);
  CausalLM u = CausalLM::from_checkpoint(dir.string(), DType::f64);
  EXPECT_FALSE(u.config().tie_word_embeddings);
  write_checkpoint(ref_dir, untied, base);
  CausalLM uref = CausalLM::from_checkpoint(ref_dir.string(), DType::f64);
  std::vector<ModelParam> pu = u.params(), pr = uref.params();
  ASSERT_EQ(pu.size(), pr.size());
  for (size_t i = 0; i < pu.size(); ++i) {
    EXPECT_EQ(pu[i].name, pr[i].name);
    EXPECT_TRUE(testing::bitwise_equal(pu[i].value, pr[i].value, pu[i].name));
  }
  EXPECT_EQ(loss_of(u, batch), loss_of(uref, batch));
  EXPECT_NE(loss_of(u, batch), loss_of(ref, batch));  // the head matters
  // Saved back, the config says what the model is.
  fs::path saved = temp_dir("tied_saved");
  u.save_checkpoint(saved.string());
  EXPECT_FALSE(load_model_config(saved.string()).tie_word_embeddings);

  // lm_head.weight alone: the tied embedding takes its values.
  NamedTensors head_only = base;
  std::erase_if(head_only, [](const auto& t) { return t.first == "model.embed_tokens.weight"; });
  write_checkpoint(dir, tied, head_only);
  CausalLM h = CausalLM::from_checkpoint(dir.string(), DType::f64);
  EXPECT_TRUE(h.config().tie_word_embeddings);
  EXPECT_TRUE(testing::bitwise_equal(h.params().front().value, head.to(DType::f64),
                                     "model.embed_tokens.weight"));
  for (const fs::path& d : {dir, ref_dir, saved}) fs::remove_all(d);
}

// bf16 and f32 runs of the same weights against the f64 run. Tolerances:
// f32 rounds every step at 2^-24 and sums in other orders (loss to 1e-5
// relative); bf16 rounds activations at 2^-8 through 3 layers, and a routing
// near-tie can pick another expert, so the loss only to 3e-2 relative.
TEST(ModelPrecision, F32AndBf16ForwardsTrackF64) {
  testing::SingleThread one_thread;  // tiny shapes
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  CausalLM ref(c, DType::f64);
  testing::randomize(ref, 31);
  fs::path dir = temp_dir("precision");
  ref.save_checkpoint(dir.string(), DType::f32);  // weights exactly representable in f32
  CausalLM m64 = CausalLM::from_checkpoint(dir.string(), DType::f64);
  testing::Batch batch = testing::make_batch(c.vocab_size, 32, 4, 8);
  const double want = loss_of(m64, batch);
  const Tensor logits64 = m64.logits().clone();
  for (auto [dt, rtol] : {std::pair{DType::f32, 1e-5}, std::pair{DType::bf16, 3e-2}}) {
    CausalLM m = CausalLM::from_checkpoint(dir.string(), dt);
    const double got = loss_of(m, batch);
    EXPECT_NEAR(got, want, rtol * std::abs(want)) << dtype_name(dt);
    double scale = 0;
    for (int64_t i = 0; i < logits64.numel(); ++i) scale = std::max(scale, std::abs(logits64.get(i)));
    EXPECT_TRUE(testing::all_close(m.logits(), logits64, 0, 10 * rtol * scale,
                                   std::string(dtype_name(dt)) + " logits"));
    // Gradients exist in f32 and are finite.
    m.forward(batch.ids, batch.targets, batch.B, batch.T);
    m.backward();
    for (ModelParam& p : m.params()) {
      ASSERT_EQ(p.grad.dtype(), DType::f32) << p.name;
      for (int64_t i = 0; i < p.grad.numel(); ++i) ASSERT_TRUE(std::isfinite(p.grad.get(i))) << p.name;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tiermoe
