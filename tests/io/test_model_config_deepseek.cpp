// DeepSeek-V3's and Kimi-K2's config.json: the published files read into
// the presets' fields, the fields DeepSeek's own code reads refused when they
// ask for another architecture, the parameter counts of the model cards,
// and config.json written back as transformers reads it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/test_safetensors_util.h"
#include "tiermoe/core/error.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {
namespace {

using testing::throws_error_with;

// deepseek-ai/DeepSeek-V3's config.json as published (its fp8
// quantization_config left out: TierMoE does not read block FP8 yet).
const char* const kDeepseekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
  "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 129280})";

nlohmann::json deepseek_with(const nlohmann::json& changes) {
  nlohmann::json j = nlohmann::json::parse(kDeepseekV3);
  j.merge_patch(changes);
  return j;
}

void expect_same_model(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.to_json(), b.to_json());
}

TEST(DeepseekV3Config, ThePublishedConfigIsThePreset) {
  const ModelConfig c = parse_model_config(kDeepseekV3, "config.json");
  EXPECT_TRUE(c.mla());
  EXPECT_TRUE(c.sigmoid_router());
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.v_dim(), 128);
  EXPECT_EQ(c.head_dim, 64);  // the rope width, as transformers sets it
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_TRUE(c.rope_interleave);  // transformers' default: the file does not say
  EXPECT_EQ(c.num_moe_layers(), 58);
  EXPECT_EQ(c.shared_expert_intermediate_size, 2048);
  EXPECT_FALSE(c.output_router_logits);  // no load-balancing loss, as in transformers
  expect_same_model(c, preset("deepseek-v3"));
}

// Kimi-K2 ships the same architecture under model_type kimi_k2; it is
// written back as deepseek_v3, the type transformers implements.
TEST(DeepseekV3Config, KimiK2IsTheSameArchitecture) {
  nlohmann::json j = deepseek_with({{"model_type", "kimi_k2"},
                                    {"vocab_size", 163840},
                                    {"num_attention_heads", 64},
                                    {"num_key_value_heads", 64},
                                    {"n_routed_experts", 384},
                                    {"n_group", 1},
                                    {"topk_group", 1},
                                    {"first_k_dense_replace", 1},
                                    {"routed_scaling_factor", 2.827},
                                    {"num_nextn_predict_layers", 0},
                                    {"rope_theta", 50000.0},
                                    {"max_position_embeddings", 131072},
                                    {"bos_token_id", 163584},
                                    {"eos_token_id", 163585},
                                    {"rope_scaling", {{"beta_fast", 1.0}, {"factor", 32.0}}}});
  const ModelConfig c = parse_model_config(j.dump(), "config.json");
  EXPECT_EQ(c.family, ModelFamily::deepseek_v3);
  expect_same_model(c, preset("kimi-k2"));
  EXPECT_EQ(nlohmann::json::parse(c.to_json()).at("model_type"), "deepseek_v3");
}

// q_lora_rank null: q_proj straight from the hidden state. A missing
// num_key_value_heads (transformers' default 128, never read by MLA) is the
// head count.
TEST(DeepseekV3Config, TheQProjFormAndAnyKvHeadCount) {
  nlohmann::json j = deepseek_with({{"num_attention_heads", 16}});
  j["q_lora_rank"] = nullptr;  // set, not merged: a merge patch's null deletes
  j.erase("num_key_value_heads");
  const ModelConfig c = parse_model_config(j.dump(), "config.json");
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.num_key_value_heads, 16);
  const ModelConfig back = parse_model_config(c.to_json(), "written");
  EXPECT_EQ(back.q_lora_rank, 0);
  expect_same_model(back, c);
  bool q_proj = false;
  for (const HfTensor& t : hf_tensors(c)) {
    EXPECT_EQ(t.name.find("q_a_proj"), std::string::npos) << t.name;
    q_proj |= t.name == "model.layers.0.self_attn.q_proj.weight";
  }
  EXPECT_TRUE(q_proj);
}

// What DeepSeek's own configuration code reads but transformers ignores,
// refused when it asks for another architecture; bad MLA sizes named.
TEST(DeepseekV3Config, OtherArchitecturesAreClearErrors) {
  const std::pair<nlohmann::json, std::vector<std::string>> cases[] = {
      {{{"topk_method", "greedy"}}, {"topk_method", "greedy", "noaux_tc"}},
      {{{"scoring_func", "softmax"}}, {"scoring_func", "softmax", "sigmoid"}},
      {{{"moe_layer_freq", 2}}, {"moe_layer_freq", "set moe_layer_freq to 1"}},
      {{{"kv_lora_rank", 0}}, {"kv_lora_rank", "positive"}},
      {{{"v_head_dim", -1}}, {"v_head_dim", "positive"}},
      {{{"q_lora_rank", -3}}, {"q_lora_rank", "null"}},
      {{{"qk_rope_head_dim", 63}}, {"head_dim 63 is odd"}},
      {{{"quantization_config", {{"quant_method", "fp8"}}}},
       {"weight_block_size is absent", "[128, 128]"}},
      {{{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}}}},
       {"weight_block_size is [64,64]", "as DeepSeek-V3 ships it"}},
      {{{"quantization_config", {{"quant_method", "gptq"}}}}, {"'gptq'", "dequantize others"}}};
  for (const auto& [change, want] : cases) {
    EXPECT_TRUE(throws_error_with(
        [&] { parse_model_config(deepseek_with(change).dump(), "config.json"); }, want))
        << change.dump();
  }
}

// "671B total parameters with 37B activated for each token" (DeepSeek-V3's
// model card, without its 14B multi-token-prediction module); Kimi-K2's
// "1 trillion total parameters, 32 billion activated".
TEST(DeepseekV3Config, ParamCountsOfTheModelCards) {
  const ParamCounts v3 = param_counts(preset("deepseek-v3"));
  EXPECT_NEAR(double(v3.total) / 1e9, 671.0, 0.5);
  EXPECT_NEAR(double(v3.active_per_token) / 1e9, 37.5, 0.6);
  const ParamCounts kimi = param_counts(preset("kimi-k2"));
  EXPECT_NEAR(double(kimi.total) / 1e12, 1.03, 0.02);
  EXPECT_NEAR(double(kimi.active_per_token) / 1e9, 32.5, 0.6);
}

// The closed-form counts agree with the tensor list in both MLA forms, with
// and without attention_bias.
TEST(DeepseekV3Config, ParamCountsMatchTheTensorList) {
  for (const nlohmann::json& change :
       {nlohmann::json::object(), nlohmann::json{{"q_lora_rank", nullptr}},
        nlohmann::json{{"attention_bias", true}},
        nlohmann::json{{"attention_bias", true}, {"q_lora_rank", nullptr}}}) {
    nlohmann::json j = deepseek_with(change);
    j.merge_patch({{"num_hidden_layers", 4}, {"n_routed_experts", 16}, {"hidden_size", 64}});
    const ModelConfig c = parse_model_config(j.dump(), "config.json");
    int64_t total = 0;
    for (const HfTensor& t : hf_tensors(c)) total += shape_numel(t.shape);
    EXPECT_EQ(param_counts(c).total, total) << change.dump();
  }
}

}  // namespace
}  // namespace tiermoe
