#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/test_safetensors_util.h"
#include "tiermoe/core/error.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {
namespace {

// Qwen/Qwen3-30B-A3B's config.json as published.
constexpr const char* kQwen3_30B = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// mistralai/Mixtral-8x7B-v0.1's config.json.
constexpr const char* kMixtral = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000
})";

std::string expect_error(const std::string& json, const std::string& path = "cfg/config.json") {
  try {
    parse_model_config(json, path);
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), path) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for " << json;
  return "";
}

TEST(ModelConfig, ParsesTheRealQwen3_30B_A3B) {
  ModelConfig c = parse_model_config(kQwen3_30B, "config.json");
  EXPECT_EQ(c.family, ModelFamily::qwen3_moe);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 6144);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);  // so q_proj's output (4096) differs from hidden
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.renormalize_topk());
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{151645});
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.qk_norm(), QkNorm::per_head);
  EXPECT_EQ(c.num_moe_layers(), 48);
  // The preset is the same config, field for field.
  EXPECT_EQ(preset("qwen3-30b-a3b").to_json(), c.to_json());
}

// Qwen/Qwen2-57B-A14B's and zai-org/GLM-4.5-Air's config.json as published
// (transformers 4 spellings), against their presets field for field.
constexpr const char* kQwen2_57B = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
  "max_window_layers": 28, "model_type": "qwen2_moe", "moe_intermediate_size": 2560,
  "norm_topk_prob": false, "num_attention_heads": 28, "num_experts": 64,
  "num_experts_per_tok": 8, "num_hidden_layers": 28, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 20480,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";
constexpr const char* kGlm45Air = R"({
  "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
  "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
  "model_type": "glm4_moe", "moe_intermediate_size": 1408, "norm_topk_prob": true,
  "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
  "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
  "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 1000000,
  "num_nextn_predict_layers": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.54.0", "use_cache": true, "use_qk_norm": false,
  "vocab_size": 151552})";

TEST(ModelConfig, ParsesTheRealQwen2_57B_A14B) {
  ModelConfig c = parse_model_config(kQwen2_57B, "config.json");
  EXPECT_EQ(c.family, ModelFamily::qwen2_moe);
  EXPECT_EQ(c.shared_expert_intermediate_size, 20480);
  EXPECT_TRUE(c.qkv_bias);  // the Qwen2MoeConfig default
  EXPECT_TRUE(c.shared_expert_gated());
  EXPECT_EQ(c.head_dim, 128);  // 3584 / 28
  EXPECT_EQ(c.qk_norm(), QkNorm::none);
  EXPECT_EQ(c.num_moe_layers(), 28);
  EXPECT_EQ(preset("qwen2-57b-a14b").to_json(), c.to_json());
}

// openai/gpt-oss-20b's config.json as published (its quantization_config,
// MXFP4 experts, left out: loading those is another issue's).
constexpr const char* kGptOss20b = R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
  "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
  "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
    "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
  "swiglu_limit": 7.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.55.0.dev0",
  "use_cache": true, "vocab_size": 201088
})";

TEST(ModelConfig, ParsesTheRealGptOss20b) {
  ModelConfig c = parse_model_config(kGptOss20b, "config.json");
  EXPECT_EQ(c.family, ModelFamily::gpt_oss);
  EXPECT_EQ(c.num_experts, 32);
  EXPECT_EQ(c.moe_intermediate_size, 2880);
  EXPECT_EQ(c.num_moe_layers(), 24);
  EXPECT_EQ(c.attention_window(0), 128);
  EXPECT_EQ(c.attention_window(1), 0);
  EXPECT_EQ(c.qk_norm(), QkNorm::none);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::yarn);
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_EQ(c.rope_theta, 150000);
  EXPECT_EQ(c.swiglu_alpha, 1.702);  // GptOssConfig's default: the file omits it
  EXPECT_EQ(preset("gpt-oss-20b").to_json(), c.to_json());
  // OpenAI's model card: 21 B parameters, 3.6 B active per token (its count
  // leaves out the input embedding, a lookup).
  const ParamCounts n = param_counts(c);
  EXPECT_NEAR(double(n.total) / 1e9, 20.9, 0.2);
  EXPECT_NEAR(double(n.active_per_token - n.embedding) / 1e9, 3.6, 0.05);
  // What TierMoE writes, transformers' class reads back the same.
  EXPECT_EQ(parse_model_config(c.to_json(), "again").to_json(), c.to_json());
}

// GptOssConfig's defaults when the fields are absent: the 120b's shapes,
// alternating layers (sliding first), YaRN factor 32 untruncated.
TEST(ModelConfig, GptOssDefaultsFollowGptOssConfig) {
  ModelConfig c = parse_model_config(R"({"model_type": "gpt_oss"})", "config.json");
  EXPECT_EQ(c.num_hidden_layers, 36);
  EXPECT_EQ(c.num_experts, 128);
  ASSERT_EQ(c.layer_types.size(), 36u);
  EXPECT_EQ(c.layer_types[0], "sliding_attention");
  EXPECT_EQ(c.layer_types[35], "full_attention");
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_FALSE(c.rope_scaling.truncate);
  EXPECT_EQ(c.sliding_window, 128);
}

TEST(ModelConfig, GptOssLayerTypesAreChecked) {
  for (const auto& [json, words] :
       {std::pair{R"({"model_type": "gpt_oss", "num_hidden_layers": 2,
                      "layer_types": ["full_attention"]})",
                  std::vector<std::string>{"layer_types", "1 layers of 2"}},
        {R"({"model_type": "gpt_oss", "num_hidden_layers": 1, "layer_types": ["chunked"]})",
         {"layer_types", "chunked"}},
        {R"({"model_type": "gpt_oss", "num_hidden_layers": 1, "sliding_window": null,
             "layer_types": ["sliding_attention"]})",
         {"sliding_window", "null"}}}) {
    EXPECT_TRUE(testing::throws_error_with([&] { parse_model_config(json, "config.json"); },
                                           {words[0], words[1], "config.json"}))
        << json;
  }
}

// Values transformers would refuse or crash on are errors, not defaults: a
// YaRN factor of 0 (read as absent before), a null swiglu_alpha (read as
// 1.702 before).
TEST(ModelConfig, ZeroAndNullAreNotAbsent) {
  for (const auto& [json, words] :
       {std::pair{
            R"({"model_type": "gpt_oss", "rope_scaling": {"rope_type": "yarn", "factor": 0}})",
            std::vector<std::string>{"has yarn factor 0", "positive"}},
        {R"({"model_type": "gpt_oss", "swiglu_alpha": null})", {"'swiglu_alpha' is null"}},
        {R"({"model_type": "gpt_oss", "swiglu_limit": null})", {"'swiglu_limit' is null"}}}) {
    EXPECT_TRUE(testing::throws_error_with([&] { parse_model_config(json, "config.json"); },
                                           {words[0], words.back(), "config.json"}))
        << json;
  }
  // Absent, they take the class defaults.
  const ModelConfig c = parse_model_config(R"({"model_type": "gpt_oss"})", "config.json");
  EXPECT_EQ(c.swiglu_alpha, 1.702);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
}

TEST(ModelConfig, ParsesTheRealGlm45Air) {
  ModelConfig c = parse_model_config(kGlm45Air, "config.json");
  EXPECT_EQ(c.family, ModelFamily::glm4_moe);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.shared_expert_intermediate_size, 1408);
  EXPECT_FALSE(c.shared_expert_gated());
  EXPECT_TRUE(c.sigmoid_router());
  EXPECT_TRUE(c.qkv_bias);  // attention_bias: q, k and v only
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.num_moe_layers(), 45);  // layer 0 is dense
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{151329, 151336, 151338}));
  EXPECT_EQ(preset("glm-4.5-air").to_json(), c.to_json());
  // About 106 B parameters (GLM-4.5-Air's published size), without the MTP layer.
  EXPECT_NEAR(double(param_counts(c).total) / 1e9, 106.0, 4.0);
}

TEST(ModelConfig, AbsentFieldsTakeQwen3MoeConfigDefaults) {
  ModelConfig c = parse_model_config(R"({"model_type": "qwen3_moe"})", "config.json");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 2048 / 32);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_FALSE(c.renormalize_topk());
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.initializer_range, 0.02);
  EXPECT_EQ(c.router_aux_loss_coef, 0.001);
  EXPECT_FALSE(c.output_router_logits);
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_TRUE(c.eos_token_id.empty());
}

TEST(ModelConfig, NullKvHeadsMeansOnePerQueryHead) {
  ModelConfig c = parse_model_config(
      R"({"model_type": "qwen3_moe", "num_attention_heads": 8, "num_key_value_heads": null})", "c");
  EXPECT_EQ(c.num_key_value_heads, 8);
}

TEST(ModelConfig, TransformersV5Spellings) {
  ModelConfig c = parse_model_config(R"({"model_type": "qwen3_moe", "num_local_experts": 16,
      "num_experts_per_tok": 4, "dtype": "bfloat16",
      "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0},
      "eos_token_id": [151645, 151643]})",
                                     "c");
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{151645, 151643}));
}

TEST(ModelConfig, MoeLayersFollowSparseStepAndMlpOnlyLayers) {
  ModelConfig c = parse_model_config(R"({"model_type": "qwen3_moe", "num_hidden_layers": 6,
      "decoder_sparse_step": 2, "mlp_only_layers": [3]})",
                                     "c");
  std::vector<bool> moe;
  for (int l = 0; l < 6; ++l) moe.push_back(c.is_moe_layer(l));
  // (l + 1) % 2 == 0 selects 1, 3, 5; layer 3 is forced dense.
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_EQ(c.num_moe_layers(), 2);
}

// The count is not a loop over the layers: a config.json may claim any
// num_hidden_layers, and validate() counts the MoE layers while parsing.
TEST(ModelConfig, MoeLayerCountIsIsMoeLayerCountedWithoutALoop) {
  for (int64_t L = 1; L <= 12; ++L) {
    for (int64_t step = 1; step <= 3; ++step) {
      ModelConfig c = preset("tiny");
      c.num_hidden_layers = L;
      c.decoder_sparse_step = step;
      c.mlp_only_layers = {1, 4, 4, 20, 0};  // a repeat and one past the end
      int64_t n = 0;
      for (int64_t l = 0; l < L; ++l) n += c.is_moe_layer(l);
      EXPECT_EQ(c.num_moe_layers(), n) << "L " << L << " step " << step;
    }
  }
  // Far past what validation accepts (test_model_config_bounds.cpp): the
  // count must not loop even where nothing has bounded the field yet.
  ModelConfig huge = preset("tiny");
  huge.num_hidden_layers = 4611686018427387904;
  huge.decoder_sparse_step = 2;
  huge.mlp_only_layers = {1, 3, 3, 6};
  EXPECT_EQ(huge.num_moe_layers(), 4611686018427387904 / 2 - 2);
}

// A hostile config.json's sizes multiply past int64: an Error, not a wrapped count.
TEST(ModelConfig, ParamCountsThatOverflowAreAnError) {
  ModelConfig c = preset("tiny");
  c.vocab_size = int64_t(1) << 40;
  c.hidden_size = int64_t(1) << 30;
  try {
    param_counts(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overflows 64 bits"), std::string::npos) << e.what();
  }
  c.vocab_size = 256;
  c.hidden_size = 64;
  EXPECT_EQ(param_counts(c).total, param_counts(preset("tiny")).total);
}

TEST(ModelConfig, Mixtral) {
  ModelConfig c = parse_model_config(kMixtral, "c");
  EXPECT_EQ(c.family, ModelFamily::mixtral);
  EXPECT_EQ(c.moe_intermediate_size, 14336);  // intermediate_size is the expert width
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.router_aux_loss_coef, 0.02);
  EXPECT_TRUE(c.renormalize_topk());
  EXPECT_EQ(c.qk_norm(), QkNorm::none);
  EXPECT_EQ(c.num_moe_layers(), 32);

  ModelConfig d = parse_model_config(R"({"model_type": "mixtral"})", "c");
  EXPECT_EQ(d.num_key_value_heads, 8);
  EXPECT_EQ(d.rms_norm_eps, 1e-5);
  EXPECT_EQ(d.router_aux_loss_coef, 0.001);
  EXPECT_EQ(d.bos_token_id, 1);
  EXPECT_EQ(d.max_position_embeddings, 4096 * 32);
}

TEST(ModelConfig, Olmoe) {
  ModelConfig c = parse_model_config(R"({"model_type": "olmoe", "clip_qkv": 8.0})", "c");
  EXPECT_EQ(c.family, ModelFamily::olmoe);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.num_key_value_heads, 16);  // None in OlmoeConfig: one kv head per head
  EXPECT_EQ(c.head_dim, 2048 / 16);
  EXPECT_FALSE(c.renormalize_topk());
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.router_aux_loss_coef, 0.01);
  EXPECT_EQ(c.pad_token_id, 1);
  EXPECT_EQ(c.clip_qkv, 8.0);
  EXPECT_EQ(c.qk_norm(), QkNorm::whole);
}

struct BadConfig {
  const char* name;
  const char* json;
  std::vector<const char*> mentions;  // substrings the message must contain
};

class ModelConfigErrors : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ModelConfigErrors, NameFileFieldAndHint) {
  std::string msg = expect_error(GetParam().json);
  for (const char* m : GetParam().mentions) EXPECT_NE(msg.find(m), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    All, ModelConfigErrors,
    ::testing::Values(
        BadConfig{
            "unknown_type",
            R"({"model_type": "llama"})",
            {"llama",
             "qwen3_moe, mixtral, olmoe, qwen2_moe, glm4_moe, gpt_oss, deepseek_v3 (kimi_k2), "
             "glm4_moe_lite, deepseek_v2, minimax_m2, qwen3_5_moe_text"}},
        BadConfig{"no_type", R"({"hidden_size": 64})", {"model_type"}},
        BadConfig{"invalid_json", R"({"model_type": "qwen3_moe",)", {"invalid JSON"}},
        BadConfig{"not_object", R"([1, 2])", {"array"}},
        BadConfig{"heads_not_dividing",
                  R"({"model_type": "qwen3_moe", "num_attention_heads": 6,
                      "num_key_value_heads": 4, "head_dim": 16})",
                  {"num_attention_heads 6", "num_key_value_heads 4"}},
        BadConfig{"hidden_not_divisible",
                  R"({"model_type": "qwen3_moe", "hidden_size": 100, "num_attention_heads": 8,
                      "num_key_value_heads": 4})",
                  {"hidden_size 100", "head_dim"}},
        BadConfig{"k_above_e",
                  R"({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 8})",
                  {"num_experts_per_tok", "E = 4"}},
        BadConfig{"zero_hidden",
                  R"({"model_type": "qwen3_moe", "hidden_size": 0})",
                  {"hidden_size", "positive"}},
        BadConfig{"negative_vocab",
                  R"({"model_type": "qwen3_moe", "vocab_size": -1})",
                  {"vocab_size", "positive"}},
        BadConfig{"zero_experts_mixtral",
                  R"({"model_type": "mixtral", "num_local_experts": 0})",
                  {"num_local_experts"}},
        BadConfig{"string_size",
                  R"({"model_type": "qwen3_moe", "hidden_size": "2048"})",
                  {"hidden_size", "integer", "string"}},
        BadConfig{"float_size",
                  R"({"model_type": "qwen3_moe", "hidden_size": 2048.0})",
                  {"hidden_size", "integer"}},
        BadConfig{"int_bool",
                  R"({"model_type": "qwen3_moe", "norm_topk_prob": 1})",
                  {"norm_topk_prob", "true or false"}},
        BadConfig{"string_eps",
                  R"({"model_type": "qwen3_moe", "rms_norm_eps": "1e-6"})",
                  {"rms_norm_eps", "number"}},
        BadConfig{"list_type",
                  R"({"model_type": "qwen3_moe", "mlp_only_layers": [0.5]})",
                  {"mlp_only_layers"}},
        BadConfig{"mlp_only_out_of_range",
                  R"({"model_type": "qwen3_moe", "num_hidden_layers": 2, "mlp_only_layers": [2]})",
                  {"mlp_only_layers", "layer 2"}},
        BadConfig{"gelu",
                  R"({"model_type": "qwen3_moe", "hidden_act": "gelu"})",
                  {"hidden_act", "gelu", "silu"}},
        BadConfig{"longrope",
                  R"({"model_type": "qwen3_moe",
                      "rope_scaling": {"rope_type": "longrope", "factor": 4.0}})",
                  {"rope_scaling", "longrope", "yarn"}},
        BadConfig{"yarn_factor",
                  R"({"model_type": "qwen3_moe", "rope_scaling": {"rope_type": "yarn",
                      "factor": -2.0, "original_max_position_embeddings": 4096}})",
                  {"yarn", "factor -2"}},
        BadConfig{"sliding",
                  R"({"model_type": "qwen3_moe", "use_sliding_window": true})",
                  {"use_sliding_window"}},
        BadConfig{"aliases_disagree",
                  R"({"model_type": "qwen3_moe", "num_experts": 8, "num_local_experts": 16})",
                  {"num_experts", "num_local_experts"}},
        BadConfig{
            "odd_head_dim", R"({"model_type": "qwen3_moe", "head_dim": 15})", {"head_dim 15"}},
        BadConfig{"pad_outside_vocab",
                  R"({"model_type": "olmoe", "vocab_size": 64, "pad_token_id": 64,
                      "hidden_size": 64, "num_attention_heads": 4})",
                  {"pad_token_id 64"}},
        BadConfig{"jitter",
                  R"({"model_type": "mixtral", "router_jitter_noise": 0.1})",
                  {"router_jitter_noise"}},
        BadConfig{"qwen2_sliding_layer",
                  R"({"model_type": "qwen2_moe", "num_hidden_layers": 2,
                      "layer_types": ["full_attention", "sliding_attention"]})",
                  {"layer_types", "sliding_attention"}},
        BadConfig{"glm_rotary_odd",
                  R"({"model_type": "glm4_moe", "head_dim": 12, "partial_rotary_factor": 0.25})",
                  {"partial_rotary_factor 0.25", "even"}},
        BadConfig{"glm_groups",
                  R"({"model_type": "glm4_moe", "head_dim": 128, "n_routed_experts": 8,
                      "num_experts_per_tok": 2, "n_group": 3})",
                  {"n_group 3", "n_routed_experts"}},
        BadConfig{"qwen2_no_shared_expert",
                  R"({"model_type": "qwen2_moe", "shared_expert_intermediate_size": 0})",
                  {"shared_expert_intermediate_size", "positive"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(ModelConfig, ToJsonRoundTripsEveryPresetAndFamily) {
  std::vector<ModelConfig> configs;
  for (const auto& name : preset_names()) configs.push_back(preset(name));
  configs.push_back(parse_model_config(kMixtral, "mixtral"));
  configs.push_back(parse_model_config(R"({"model_type": "olmoe", "clip_qkv": 4.5})", "olmoe"));
  configs.push_back(parse_model_config(R"({"model_type": "qwen2_moe", "qkv_bias": false,
      "head_dim": 64, "num_attention_heads": 8, "num_key_value_heads": 2})",
                                       "qwen2_moe"));
  configs.push_back(parse_model_config(R"({"model_type": "qwen3_moe", "num_hidden_layers": 4,
      "decoder_sparse_step": 2, "mlp_only_layers": [1], "tie_word_embeddings": true,
      "attention_bias": true, "pad_token_id": 7, "eos_token_id": [1, 2]})",
                                       "qwen3"));
  for (const ModelConfig& c : configs) {
    std::string text = c.to_json();
    ModelConfig back = parse_model_config(text, "roundtrip");
    EXPECT_EQ(back.to_json(), text);
    EXPECT_EQ(back.family, c.family);
    EXPECT_EQ(back.moe_intermediate_size, c.moe_intermediate_size);
    EXPECT_EQ(back.head_dim, c.head_dim);
    EXPECT_EQ(back.mlp_only_layers, c.mlp_only_layers);
    EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps);
    EXPECT_EQ(back.pad_token_id, c.pad_token_id);
    EXPECT_EQ(back.clip_qkv, c.clip_qkv);
    EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings);
    EXPECT_EQ(back.attention_bias, c.attention_bias);
    EXPECT_EQ(back.qkv_bias, c.qkv_bias);
    EXPECT_EQ(back.shared_expert_intermediate_size, c.shared_expert_intermediate_size);
  }
}

// YaRN as Qwen3's long-context configs write it (v4, rope_scaling) and as
// transformers 5 does (rope_parameters); a missing factor is
// max_position_embeddings / original_max_position_embeddings.
TEST(ModelConfig, YarnRopeScaling) {
  ModelConfig c = parse_model_config(R"({"model_type": "qwen3_moe", "rope_theta": 1000000.0,
      "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 32768}})",
                                     "config.json");
  EXPECT_EQ(c.rope_scaling.kind, RopeScaling::Kind::yarn);
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.0);
  EXPECT_TRUE(c.rope_scaling.truncate);
  EXPECT_EQ(parse_model_config(c.to_json(), "roundtrip").to_json(), c.to_json());
  ModelConfig v5 = parse_model_config(R"({"model_type": "qwen3_moe",
      "max_position_embeddings": 8192, "rope_parameters": {"rope_type": "yarn",
      "rope_theta": 5000.0, "original_max_position_embeddings": 2048, "mscale": 0.707,
      "mscale_all_dim": 0.707, "truncate": false}})",
                                      "config.json");
  EXPECT_EQ(v5.rope_theta, 5000.0);
  EXPECT_EQ(v5.rope_scaling.factor, 4.0);
  EXPECT_FALSE(v5.rope_scaling.truncate);
  EXPECT_EQ(v5.rope_scaling.mscale, 0.707);
}

// The config.json transformers 5 itself wrote for the Qwen2-MoE fixture
// (scripts/fixtures/make_family_fixture.py).
TEST(ModelConfig, Qwen2MoeAsTransformersWritesIt) {
  const ModelConfig c =
      load_model_config(std::string(TIERMOE_TEST_DATA_DIR) + "/families/qwen2_moe");
  EXPECT_EQ(c.family, ModelFamily::qwen2_moe);
  EXPECT_EQ(c.qk_norm(), QkNorm::none);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.shared_expert_intermediate_size, 24);
  EXPECT_EQ(c.moe_intermediate_size, 16);
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.head_dim, 8);  // no head_dim field: D / H
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.mlp_only_layers, std::vector<int64_t>{1});
  EXPECT_FALSE(c.sliding_window);  // transformers writes 0 for "none"
  EXPECT_TRUE(c.output_router_logits);
  EXPECT_EQ(c.torch_dtype, "float64");
  int64_t n = 0;
  for (const HfTensor& t : hf_tensors(c)) n += shape_numel(t.shape);
  EXPECT_EQ(param_counts(c).total, n);
}

TEST(ModelConfig, ToJsonHasWhatTransformersNeeds) {
  std::string text = preset("tiny").to_json();
  for (const char* key : {R"("architectures": [)", R"("Qwen3MoeForCausalLM")",
                          R"("model_type": "qwen3_moe")", R"("torch_dtype": "bfloat16")",
                          R"("transformers_version")", R"("moe_intermediate_size": 32)",
                          R"("head_dim": 16)", R"("norm_topk_prob": true)"}) {
    EXPECT_NE(text.find(key), std::string::npos) << key << " missing from\n" << text;
  }
  std::string mixtral = parse_model_config(kMixtral, "c").to_json();
  EXPECT_NE(mixtral.find(R"("num_local_experts": 8)"), std::string::npos) << mixtral;
  EXPECT_NE(mixtral.find(R"("intermediate_size": 14336)"), std::string::npos) << mixtral;
  EXPECT_EQ(mixtral.find("moe_intermediate_size"), std::string::npos) << mixtral;
}

TEST(ModelConfig, SaveAndLoadFromFileOrDirectory) {
  auto dir = std::filesystem::temp_directory_path() / "tiermoe_test_model_config";
  std::filesystem::create_directories(dir);
  ModelConfig c = preset("small", 3);
  save_model_config(c, (dir / "config.json").string());
  EXPECT_EQ(load_model_config(dir.string()).to_json(), c.to_json());
  EXPECT_EQ(load_model_config((dir / "config.json").string()).num_hidden_layers, 3);
  std::filesystem::remove_all(dir);
  EXPECT_THROW(load_model_config(dir.string()), Error);
}

TEST(ModelConfig, Presets) {
  ModelConfig tiny = preset("tiny");
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.num_experts, 8);
  EXPECT_EQ(tiny.num_experts_per_tok, 2);
  EXPECT_EQ(preset("qwen3-30b-a3b", 2).num_hidden_layers, 2);
  EXPECT_EQ(preset("small").num_experts_per_tok, 4);
  try {
    preset("huge");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("huge"), std::string::npos);
    EXPECT_NE(msg.find("tiny, tiny-qwen2-moe, tiny-glm4-moe, tiny-gpt-oss, tiny-deepseek-v3, "
                       "tiny-glm4-moe-lite, tiny-deepseek-v2, tiny-minimax-m2, tiny-qwen3.5-moe, "
                       "small, qwen3-30b-a3b, qwen2-57b-a14b, glm-4.5-air, gpt-oss-20b, "
                       "gpt-oss-120b, deepseek-v3, kimi-k2, glm-4.7-flash, deepseek-v2, "
                       "deepseek-v2-lite, minimax-m2, qwen3.5-35b-a3b"),
              std::string::npos)
        << msg;
  }
  EXPECT_THROW(preset("tiny", 0), Error);
}

TEST(ModelConfig, ParamCountsOfQwen3_30B_A3B) {
  ParamCounts n = param_counts(preset("qwen3-30b-a3b"));
  // The published checkpoint's index says total_size 61064245248 bytes of bf16.
  EXPECT_EQ(n.total * 2, 61064245248);
  EXPECT_EQ(n.per_expert, 3 * 2048 * 768);
  EXPECT_EQ(n.experts, 48 * 128 * n.per_expert);
  // "30.5B total, 3.3B activated" in the model card.
  EXPECT_EQ(n.active_per_token, n.total - 48 * 120 * n.per_expert);
  EXPECT_NEAR(double(n.active_per_token) / 1e9, 3.3, 0.1);
}

// The closed-form counts agree with the tensor list, for every family and
// shape option that changes the list.
TEST(ModelConfig, ParamCountsMatchTheTensorList) {
  std::vector<ModelConfig> configs = {preset("tiny"), preset("small", 3)};
  configs.push_back(parse_model_config(R"({"model_type": "qwen3_moe", "vocab_size": 100,
      "hidden_size": 48, "intermediate_size": 40, "moe_intermediate_size": 24,
      "num_hidden_layers": 5, "num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 10,
      "num_experts": 6, "num_experts_per_tok": 3, "decoder_sparse_step": 2,
      "mlp_only_layers": [3], "tie_word_embeddings": true, "attention_bias": true})",
                                       "qwen3"));
  configs.push_back(parse_model_config(R"({"model_type": "mixtral", "vocab_size": 90,
      "hidden_size": 32, "intermediate_size": 20, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4})",
                                       "mixtral"));
  configs.push_back(parse_model_config(R"({"model_type": "olmoe", "vocab_size": 90,
      "hidden_size": 32, "intermediate_size": 20, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 4,
      "num_experts_per_tok": 2, "eos_token_id": 89})",
                                       "olmoe"));
  for (const ModelConfig& c : configs) {
    int64_t total = 0, experts = 0;
    for (const HfTensor& t : hf_tensors(c)) {
      total += shape_numel(t.shape);
      if (t.role == HfRole::expert) experts += shape_numel(t.shape);
    }
    ParamCounts n = param_counts(c);
    EXPECT_EQ(n.total, total) << c.to_json();
    EXPECT_EQ(n.experts, experts) << c.to_json();
    EXPECT_EQ(n.embedding, c.vocab_size * c.hidden_size);
  }
}

// init --vocab-size on a preset whose special ids lie past the new
// vocabulary (Qwen3's 151643 / 151645 with V = 4096): the ids are dropped and
// named, the rest stay, and the config is valid, as the issue's own
// benchmark set-up needs.
TEST(ModelConfig, ACutVocabularyDropsTheSpecialIdsItCannotHold) {
  ModelConfig c = preset("qwen3-30b-a3b", 1);
  ASSERT_TRUE(c.bos_token_id.has_value());
  ASSERT_FALSE(c.eos_token_id.empty());
  c.eos_token_id.push_back(7);  // one id the cut keeps
  c.pad_token_id = 9;
  const std::vector<std::string> dropped = c.set_vocab_size(4096);
  EXPECT_EQ(c.vocab_size, 4096);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{7});
  EXPECT_EQ(c.pad_token_id, std::optional<int64_t>(9));
  EXPECT_EQ(dropped, (std::vector<std::string>{"bos_token_id 151643", "eos_token_id 151645"}));
  EXPECT_NO_THROW(c.validate("test"));
  // A vocabulary that holds them keeps them all.
  ModelConfig whole = preset("qwen3-30b-a3b", 1);
  EXPECT_TRUE(whole.set_vocab_size(whole.vocab_size).empty());
}

}  // namespace
}  // namespace tiermoe
