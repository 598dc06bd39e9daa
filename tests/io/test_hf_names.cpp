#include "tiermoe/io/hf_names.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "common/testing.h"

namespace tiermoe {
namespace {

std::map<std::string, Shape> by_name(const ModelConfig& c) {
  std::map<std::string, Shape> m;
  for (const HfTensor& t : hf_tensors(c)) {
    EXPECT_TRUE(m.emplace(t.name, t.shape).second) << "duplicate " << t.name;
  }
  return m;
}

TEST(HfNames, Qwen3_30B_A3BShapesMatchTheCheckpoint) {
  auto m = by_name(preset("qwen3-30b-a3b"));
  // The published checkpoint: per layer 4 projections, q/k norms, 2 layer norms, a router
  // and 3 per expert; then the embedding, final norm and lm_head.
  EXPECT_EQ(m.size(), size_t(48 * (4 + 2 + 2 + 1 + 3 * 128) + 3));
  EXPECT_EQ(m.at("model.embed_tokens.weight"), (Shape{151936, 2048}));
  EXPECT_EQ(m.at("model.layers.0.input_layernorm.weight"), (Shape{2048}));
  EXPECT_EQ(m.at("model.layers.7.post_attention_layernorm.weight"), (Shape{2048}));
  EXPECT_EQ(m.at("model.layers.47.self_attn.q_proj.weight"), (Shape{4096, 2048}));
  EXPECT_EQ(m.at("model.layers.47.self_attn.k_proj.weight"), (Shape{512, 2048}));
  EXPECT_EQ(m.at("model.layers.47.self_attn.v_proj.weight"), (Shape{512, 2048}));
  EXPECT_EQ(m.at("model.layers.47.self_attn.o_proj.weight"), (Shape{2048, 4096}));
  EXPECT_EQ(m.at("model.layers.47.self_attn.q_norm.weight"), (Shape{128}));
  EXPECT_EQ(m.at("model.layers.47.self_attn.k_norm.weight"), (Shape{128}));
  EXPECT_EQ(m.at("model.layers.3.mlp.gate.weight"), (Shape{128, 2048}));
  EXPECT_EQ(m.at("model.layers.3.mlp.experts.127.gate_proj.weight"), (Shape{768, 2048}));
  EXPECT_EQ(m.at("model.layers.3.mlp.experts.127.up_proj.weight"), (Shape{768, 2048}));
  EXPECT_EQ(m.at("model.layers.3.mlp.experts.0.down_proj.weight"), (Shape{2048, 768}));
  EXPECT_EQ(m.at("model.norm.weight"), (Shape{2048}));
  EXPECT_EQ(m.at("lm_head.weight"), (Shape{151936, 2048}));
  EXPECT_EQ(m.count("model.layers.48.input_layernorm.weight"), 0u);
  EXPECT_EQ(m.count("model.layers.0.self_attn.q_proj.bias"), 0u);
}

TEST(HfNames, DenseLayersTiedEmbeddingsAndBiases) {
  ModelConfig c = preset("tiny", 4);
  c.decoder_sparse_step = 2;  // layers 1 and 3 are MoE
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  auto m = by_name(c);
  EXPECT_EQ(m.count("lm_head.weight"), 0u);
  EXPECT_EQ(m.at("model.layers.0.mlp.gate_proj.weight"), (Shape{128, 64}));
  EXPECT_EQ(m.at("model.layers.0.mlp.up_proj.weight"), (Shape{128, 64}));
  EXPECT_EQ(m.at("model.layers.0.mlp.down_proj.weight"), (Shape{64, 128}));
  EXPECT_EQ(m.count("model.layers.0.mlp.gate.weight"), 0u);
  EXPECT_EQ(m.at("model.layers.1.mlp.gate.weight"), (Shape{8, 64}));
  EXPECT_EQ(m.count("model.layers.1.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(m.at("model.layers.2.self_attn.q_proj.bias"), (Shape{64}));
  EXPECT_EQ(m.at("model.layers.2.self_attn.k_proj.bias"), (Shape{32}));
  EXPECT_EQ(m.at("model.layers.2.self_attn.o_proj.bias"), (Shape{64}));
}

TEST(HfNames, MixtralUsesBlockSparseMoeAndNoQkNorm) {
  ModelConfig c = parse_model_config(R"({"model_type": "mixtral", "vocab_size": 90,
      "hidden_size": 32, "intermediate_size": 20, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4})",
                                     "c");
  auto m = by_name(c);
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.gate.weight"), (Shape{4, 32}));
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.experts.3.w1.weight"), (Shape{20, 32}));
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.experts.3.w3.weight"), (Shape{20, 32}));
  EXPECT_EQ(m.at("model.layers.1.block_sparse_moe.experts.3.w2.weight"), (Shape{32, 20}));
  for (const auto& [name, shape] : m) {
    EXPECT_EQ(name.find("q_norm"), std::string::npos) << name;
    EXPECT_EQ(name.find(".mlp."), std::string::npos) << name;
  }
}

TEST(HfNames, OlmoeNormalisesWholeProjections) {
  ModelConfig c = parse_model_config(R"({"model_type": "olmoe", "vocab_size": 90,
      "hidden_size": 32, "intermediate_size": 20, "num_hidden_layers": 1,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
      "num_experts_per_tok": 2, "eos_token_id": 89})",
                                     "c");
  auto m = by_name(c);
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_norm.weight"), (Shape{32}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.k_norm.weight"), (Shape{16}));
  EXPECT_EQ(m.at("model.layers.0.mlp.experts.3.gate_proj.weight"), (Shape{20, 32}));
}

TEST(HfNames, InitMatchesTransformersInitWeights) {
  ModelConfig c = preset("tiny");
  c.attention_bias = true;
  c.pad_token_id = 5;
  for (const HfTensor& t : hf_tensors(c)) {
    Tensor w = init_hf_tensor(t, c, 1234, DType::f64);
    ASSERT_EQ(w.shape(), t.shape) << t.name;
    if (t.role == HfRole::norm || t.role == HfRole::bias) {
      double want = t.role == HfRole::norm ? 1.0 : 0.0;
      for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(w.get(i), want) << t.name;
      continue;
    }
    if (t.role == HfRole::embedding) {
      for (int64_t j = 0; j < c.hidden_size; ++j) ASSERT_EQ(w.get(5 * c.hidden_size + j), 0.0);
    }
    // normal(0, 0.02): the sample mean and std are within ~5 standard errors.
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < w.numel(); ++i) sum += w.get(i), sq += w.get(i) * w.get(i);
    const double n = double(w.numel()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    EXPECT_LT(std::abs(mean), 5 * 0.02 / std::sqrt(n)) << t.name;
    EXPECT_LT(std::abs(sd - 0.02), 5 * 0.02 / std::sqrt(2 * n) + 0.002) << t.name;
  }
}

TEST(HfNames, InitIsAFunctionOfSeedNameAndShape) {
  ModelConfig c = preset("tiny");
  auto tensors = hf_tensors(c);
  const HfTensor& q = tensors[2];
  ASSERT_EQ(q.name, "model.layers.0.self_attn.q_proj.weight");
  Tensor a = init_hf_tensor(q, c, 7, DType::f32);
  EXPECT_TRUE(testing::bitwise_equal(init_hf_tensor(q, c, 7, DType::f32), a, q.name));
  EXPECT_FALSE(testing::bitwise_equal(init_hf_tensor(q, c, 8, DType::f32), a, q.name));
  HfTensor k = q;
  k.name = "model.layers.1.self_attn.q_proj.weight";
  EXPECT_FALSE(testing::bitwise_equal(init_hf_tensor(k, c, 7, DType::f32), a, k.name));
  // Each value is drawn in f64 and rounded once to the dtype.
  Tensor wide = init_hf_tensor(q, c, 7, DType::f64);
  EXPECT_TRUE(testing::bitwise_equal(wide.to(DType::f32), a, q.name));
  // A model with more layers shares the first layers' weights.
  ModelConfig deeper = preset("tiny", 5);
  EXPECT_TRUE(testing::bitwise_equal(init_hf_tensor(hf_tensors(deeper)[2], deeper, 7, DType::f32),
                                     a, q.name));
}

TEST(HfNames, BlocksFilledInAnyOrderGiveTheSameTensor) {
  ModelConfig c = preset("small");  // embedding 4096 x 256: 16 blocks
  c.pad_token_id = 300;             // a row inside block 1
  const HfTensor emb = hf_tensors(c)[0];
  ASSERT_EQ(emb.role, HfRole::embedding);
  ASSERT_EQ(hf_init_blocks(emb), 16);
  Tensor whole = init_hf_tensor(emb, c, 3, DType::f32);
  Tensor pieces = Tensor::empty(emb.shape, DType::f32);
  for (int64_t b = hf_init_blocks(emb) - 1; b >= 0; b -= 2) {
    fill_hf_tensor_blocks(pieces, emb, c, 3, std::max<int64_t>(b - 1, 0), b + 1);
  }
  EXPECT_TRUE(testing::bitwise_equal(pieces, whole, emb.name));
  for (int64_t j = 0; j < 256; ++j) ASSERT_EQ(whole.get(300 * 256 + j), 0.0);
  // Blocks are distinct streams: block 1 does not repeat block 0.
  EXPECT_NE(whole.get(0), whole.get(kHfInitBlock));
}

}  // namespace
}  // namespace tiermoe
