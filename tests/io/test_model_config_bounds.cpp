// Sizes in config.json are untrusted: each one, and the parameter count
// their products give, is bounded before anything loops over layers or
// allocates, and the error names the field.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>

#include "io/test_safetensors_util.h"
#include "tiermoe/core/error.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {
namespace {

struct HugeConfig {
  const char* name;
  const char* json;
  std::vector<const char*> mentions;
};

class ModelConfigBounds : public ::testing::TestWithParam<HugeConfig> {};

TEST_P(ModelConfigBounds, RefusedAtOnceNamingTheField) {
  const auto start = std::chrono::steady_clock::now();
  try {
    parse_model_config(GetParam().json, "m/config.json");
    ADD_FAILURE() << "accepted " << GetParam().json;
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "m/config.json") << e.what();
    for (const char* m : GetParam().mentions) {
      EXPECT_NE(std::string(e.what()).find(m), std::string::npos) << e.what();
    }
    EXPECT_FALSE(e.hint().empty()) << e.what();
  }
  // A loop over the claimed layers would take minutes.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
}

INSTANTIATE_TEST_SUITE_P(
    All, ModelConfigBounds,
    ::testing::Values(
        HugeConfig{"layers_9e18",
                   R"({"model_type": "qwen3_moe", "num_hidden_layers": 9000000000000000000})",
                   {"num_hidden_layers", "9000000000000000000", "16384"}},
        HugeConfig{"layers_1e6",
                   R"({"model_type": "qwen3_moe", "num_hidden_layers": 1000000})",
                   {"num_hidden_layers", "1000000"}},
        HugeConfig{"experts",
                   R"({"model_type": "olmoe", "num_experts": 100000})",
                   {"num_experts", "100000"}},
        HugeConfig{"experts_times_layers",
                   R"({"model_type": "qwen3_moe", "num_hidden_layers": 4096, "num_experts": 4096})",
                   {"16777216 experts in all"}},
        HugeConfig{"vocab_2_62",
                   R"({"model_type": "qwen3_moe", "vocab_size": 4611686018427387904})",
                   {"vocab_size", "4611686018427387904"}},
        HugeConfig{"param_overflow",
                   R"({"model_type": "qwen3_moe", "hidden_size": 1099511627776, "head_dim": 64,
                       "moe_intermediate_size": 1099511627776})",
                   {"parameter count overflows"}},
        HugeConfig{"heads_overflow",
                   R"({"model_type": "qwen3_moe", "num_attention_heads": 4294967296,
                       "num_key_value_heads": 4294967296, "head_dim": 4294967296})",
                   {"parameter count overflows"}},
        HugeConfig{"bos_outside_vocab",
                   R"({"model_type": "qwen3_moe", "vocab_size": 1000, "bos_token_id": 1000})",
                   {"bos_token_id", "1000", "[0, 1000)"}},
        HugeConfig{"eos_outside_vocab",
                   R"({"model_type": "qwen3_moe", "vocab_size": 1000, "eos_token_id": [5, 4000]})",
                   {"eos_token_id", "4000"}},
        HugeConfig{"eos_negative",
                   R"({"model_type": "qwen3_moe", "vocab_size": 1000, "eos_token_id": -1})",
                   {"eos_token_id", "-1"}}),
    [](const auto& info) { return std::string(info.param.name); });

// A config.json far past any real one (16 MiB) is refused before it is read
// (a 300 MB one was read into 1.6 GB before).
TEST(ModelConfigBounds, AHugeConfigFileIsRefusedUnread) {
  testing::TempDir dir;
  {
    std::ofstream out(dir.file("config.json"));
    out << R"({"model_type": "qwen3_moe", "pad": ")" << std::string(17 << 20, 'x') << R"("})";
  }
  EXPECT_TRUE(testing::throws_error_with([&] { load_model_config(dir.path().string()); },
                                         {"config.json is 17825", "above the 16777216", "few KB"}));
}

TEST(ModelConfigBounds, PresetLayersAreBounded) {
  EXPECT_THROW(preset("tiny", int64_t(1) << 40), Error);
  EXPECT_THROW(preset("tiny", ModelConfig::kMaxLayers + 1), Error);
  EXPECT_EQ(preset("tiny", ModelConfig::kMaxLayers).num_hidden_layers, ModelConfig::kMaxLayers);
}

// num_moe_layers counts without visiting the layers; it must give what
// visiting them gives, duplicates and dense layers included.
TEST(ModelConfigBounds, MoeLayerCountEqualsCountingLayerByLayer) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    ModelConfig c;
    c.num_hidden_layers = int64_t(rng() % 60) + 1;
    c.decoder_sparse_step = int64_t(rng() % 4) + 1;
    c.mlp_only_layers.clear();
    for (int i = int(rng() % 6); i > 0; --i) {
      c.mlp_only_layers.push_back(int64_t(rng() % uint64_t(c.num_hidden_layers)));
    }
    int64_t counted = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) counted += c.is_moe_layer(l);
    ASSERT_EQ(c.num_moe_layers(), counted)
        << "layers " << c.num_hidden_layers << " step " << c.decoder_sparse_step;
  }
}

TEST(ModelConfigBounds, ParamCountsOverflowIsAnErrorAtTheGivenPlace) {
  ModelConfig c = preset("tiny");
  c.vocab_size = int64_t(1) << 62;  // past validate(): param_counts checks on its own
  try {
    param_counts(c, "here");
    ADD_FAILURE() << "no overflow reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "here");
  }
}

}  // namespace
}  // namespace tiermoe
