// gpt-oss's MXFP4 experts as published (io/mxfp4.h), against transformers'
// own decode (convert_moe_packed_tensors) on fixtures made by
// scripts/fixtures/make_mxfp4_fixture.py (tests/data/mxfp4/): every byte
// under the extreme scales, a tiny gpt-oss whose experts are MXFP4 (its
// weights bit for bit, its eval loss in f64), the mapped binding, and bad
// tensors as clear errors.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/test_dir.h"
#include "io/test_safetensors_util.h"
#include "model/model_rig.h"
#include "tiermoe/io/mxfp4.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/model/checkpoint.h"

namespace tiermoe {
namespace {

const std::string kData = std::string(TIERMOE_TEST_DATA_DIR) + "/mxfp4/";

// Every byte value (both nibbles of every code) under scales 0, 1, 126, 127,
// 128, 254 and 255, in each dtype: transformers' float32 values, bit for bit
// (2^-127 and 2^127 included, inf under 255, -0 for code 8).
TEST(Mxfp4, EveryByteUnderTheExtremeScalesDecodesAsTransformers) {
  CheckpointTensors ck = CheckpointTensors::open(kData + "edges.safetensors");
  const Tensor want = ck.load("edge.decoded", DType::f32);
  ASSERT_EQ(mxfp4_shape(ck, "edge"), want.shape());
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    const Tensor got = load_mxfp4(ck, "edge", dt).to(DType::f32, MemTag::activations);
    EXPECT_TRUE(testing::bitwise_equal(got, want, std::string(dtype_name(dt))));
  }
}

// The tiny gpt-oss with MXFP4 experts: each decoded matrix is transformers'
// (x-major there, so transposed), and the eval loss and every gradient are
// the dequantized model's in transformers, f64.
TEST(Mxfp4, AGptOssCheckpointLoadsAsTransformersDequantizesIt) {
  testing::SingleThread one_thread;
  CausalLM model = CausalLM::from_checkpoint(kData + "model", DType::f64);
  EXPECT_EQ(model.config().quant_method, "mxfp4");
  CheckpointTensors want = CheckpointTensors::open(kData + "dequantized.safetensors");
  int checked = 0;
  for (const ModelParam& p : model.params()) {
    if (!want.contains(p.name)) continue;
    ASSERT_TRUE(p.hf_transposed) << p.name;
    EXPECT_TRUE(
        testing::bitwise_equal(swap_last_two_dims(p.value), want.load(p.name, DType::f64), p.name));
    ++checked;
  }
  EXPECT_EQ(checked, 6);  // two matrices in each of three layers

  const nlohmann::json expected = nlohmann::json::parse(std::ifstream(kData + "expected.json"));
  const int64_t L = expected.at("seq_len"), B = expected.at("batch");
  const std::vector<int32_t> tokens = read_tokens(kData + "tokens.npy");
  const std::vector<int32_t> ids(tokens.begin(), tokens.begin() + B * L);
  const std::vector<int32_t> targets(tokens.begin() + 1, tokens.begin() + B * L + 1);
  const double want_loss = expected.at("eval").at("loss");
  EXPECT_NEAR(model.forward(ids, targets, B, L, /*grad=*/true), want_loss, 1e-9 * want_loss);
  // Every gradient, the decoded experts' included, as transformers takes it.
  model.backward();
  testing::expect_grads_match(model.params(), kData + "grads_eval.safetensors", 1e-9, "mxfp4 eval");

  // Bound for LoRA (decoded to bf16, exact: every MXFP4 value is a bf16 one),
  // the f32 run gives the copied f32 run's loss.
  CausalLM copied = CausalLM::from_checkpoint(kData + "model", DType::f32);
  CausalLM mapped =
      CausalLM::from_checkpoint(kData + "model", DType::f32, nullptr, WeightBinding::mapped);
  EXPECT_EQ(copied.forward(ids, targets, B, L, false), mapped.forward(ids, targets, B, L, false));
}

class Mxfp4Dir : public testing::DirTest {
 protected:
  Mxfp4Dir() : DirTest("tiermoe_mxfp4_", 1) {}
  // A file holding entries (name, dtype, shape JSON, bytes) back to back.
  std::string write(
      const std::vector<std::tuple<std::string, std::string, std::string, size_t>>& e) {
    std::string header = "{";
    size_t at = 0;
    for (const auto& [name, dtype, shape, bytes] : e) {
      if (header.size() > 1) header += ',';
      header += testing::header_entry(name, dtype, shape, at, at + bytes);
      at += bytes;
    }
    header += '}';
    const std::string path = (dir_ / "w.safetensors").string();
    testing::write_bytes(path, testing::safetensors_bytes(header, at));
    return path;
  }
  ::testing::AssertionResult refused(const std::string& path,
                                     std::initializer_list<std::string> words) {
    return testing::throws_error_with(
        [&] { load_mxfp4(CheckpointTensors::open(path), "w", DType::f32); }, words);
  }
};

// MXFP4 blocks under a config.json without quantization_config: refused,
// as transformers refuses them (they were decoded anyway before).
TEST_F(Mxfp4Dir, BlocksWithoutTheirQuantizationConfigAreRefused) {
  for (const char* f : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(kData + "model/" + f, dir_ / f);
  }
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
  config.erase("quantization_config");
  std::ofstream(dir_ / "config.json") << config.dump(2);
  for (WeightBinding b : {WeightBinding::copy, WeightBinding::mapped}) {
    EXPECT_TRUE(testing::throws_error_with(
        [&] { CausalLM::from_checkpoint(dir_.string(), DType::f32, nullptr, b); },
        {"experts.gate_up_proj_blocks' (MXFP4)", "quantization_config is absent",
         "\"quant_method\": \"mxfp4\""}));
  }
}

TEST_F(Mxfp4Dir, BadBlocksOrScalesAreClearErrors) {
  EXPECT_TRUE(refused(write({{"w_blocks", "U8", "[1,2,1,16]", 32}}),
                      {"'w_blocks'", "not 'w_scales'", "[E, out, in/32, 16]"}));
  EXPECT_TRUE(
      refused(write({{"w_blocks", "U8", "[1,2,1,16]", 32}, {"w_scales", "F32", "[1,2,1]", 8}}),
              {"'w_scales' is F32"}));
  EXPECT_TRUE(
      refused(write({{"w_blocks", "U8", "[1,2,1,16]", 32}, {"w_scales", "U8", "[1,2,2]", 4}}),
              {"shape [1, 2, 1, 16]", "[1, 2, 2]"}));
  EXPECT_TRUE(
      refused(write({{"w_blocks", "U8", "[1,2,1,8]", 16}, {"w_scales", "U8", "[1,2,1]", 2}}),
              {"'w_blocks' has shape"}));
  // Well formed, it decodes: [1, 2, 32].
  EXPECT_EQ(load_mxfp4(CheckpointTensors::open(write({{"w_blocks", "U8", "[1,2,1,16]", 32},
                                                      {"w_scales", "U8", "[1,2,1]", 2}})),
                       "w", DType::f32)
                .shape(),
            (Shape{1, 2, 32}));
}

TEST(Mxfp4, OtherQuantizationMethodsAreRefusedAtTheConfig) {
  std::ifstream in(kData + "model/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["quantization_config"]["quant_method"] = "gptq";
  EXPECT_TRUE(testing::throws_error_with(
      [&] { parse_model_config(config.dump(), "model/config.json"); },
      {"quant_method 'gptq'", "model/config.json", "dequantize others"}));
  config["model_type"] = "qwen3_moe";
  config["quantization_config"]["quant_method"] = "mxfp4";
  EXPECT_TRUE(testing::throws_error_with(
      [&] { parse_model_config(config.dump(), "model/config.json"); }, {"mxfp4 on qwen3_moe"}));
}

}  // namespace
}  // namespace tiermoe
