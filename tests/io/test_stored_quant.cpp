// Matrices shipped at low width (io/stored_quant.h) decoded as the libraries
// that write them decode them (tests/data/quant/edges.safetensors, made by
// scripts/fixtures/make_quant_fixture.py: compressed-tensors' own packing
// and decompress, torch's float8_e4m3fn times the block scales), and bad
// files or configs refused naming the tensor or field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/test_dir.h"
#include "common/testing.h"
#include "io/test_safetensors_util.h"
#include "tiermoe/io/stored_quant.h"

namespace tiermoe {
namespace {

const std::string kEdges = std::string(TIERMOE_TEST_DATA_DIR) + "/quant/edges.safetensors";

ModelConfig compressed(int bits, int64_t group) {
  ModelConfig c;
  c.quant_method = "compressed-tensors";
  c.quant_bits = bits;
  c.quant_group = group;
  return c;
}

// Every element of `name` decoded equals `<name>.decoded` bit for bit (NaN as NaN).
void expect_decodes(const CheckpointTensors& ck, const ModelConfig& c, const std::string& name,
                    QuantFormat format) {
  SCOPED_TRACE(name);
  const auto s = find_stored_quant(ck, c, name + ".weight");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->format, format);
  const Tensor want = ck.load(name + ".decoded", DType::f32);
  EXPECT_EQ(s->shape, want.shape());
  const Tensor got = load_stored_quant(ck, *s, DType::f32);
  int64_t nan = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const float w = want.data<float>()[i], g = got.data<float>()[i];
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << i;
      ++nan;
      continue;
    }
    ASSERT_EQ(g, w) << "element " << i;
  }
  // f64: the same values, exactly (read again after the first read released
  // the source pages: they come back from the file).
  const Tensor g64 = load_stored_quant(ck, *s, DType::f64);
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isnan(want.data<float>()[i])) continue;
    ASSERT_EQ(g64.data<double>()[i], double(want.data<float>()[i])) << "element " << i;
  }
  if (name == "fp8_codes") EXPECT_EQ(nan, 2);  // 0x7f and 0xff
}

TEST(StoredQuant, DecodesAsTheLibrariesThatWriteThem) {
  const CheckpointTensors ck = CheckpointTensors::open(kEdges);
  expect_decodes(ck, compressed(4, 12), "int4", QuantFormat::int4);
  expect_decodes(ck, compressed(8, 0), "int8", QuantFormat::int8);
  ModelConfig fp8;
  fp8.quant_method = "fp8";
  expect_decodes(ck, fp8, "fp8", QuantFormat::fp8);
  expect_decodes(ck, fp8, "fp8_codes", QuantFormat::fp8);
  // A float tensor is not a stored quantized one.
  EXPECT_FALSE(find_stored_quant(ck, fp8, "fp8.decoded").has_value());
}

// Shown to fail: read with the wrong group or width, the values differ.
TEST(StoredQuant, TheCheckFailsWithAnotherGroupOrWidth) {
  const CheckpointTensors ck = CheckpointTensors::open(kEdges);
  EXPECT_TRUE(
      testing::throws_error_with([&] { find_stored_quant(ck, compressed(4, 6), "int4.weight"); },
                                 {"'int4.weight_scale' has shape [5, 3], not [5, 6]"}));
  EXPECT_TRUE(
      testing::throws_error_with([&] { find_stored_quant(ck, compressed(8, 12), "int4.weight"); },
                                 {"'int4.weight_packed' has shape [5, 5], not [5, 9]"}));
}

class StoredQuantDir : public testing::DirTest {
 protected:
  StoredQuantDir() : DirTest("tiermoe_stored_quant_") {}
  std::string write(const std::vector<TensorBytes>& t) {
    const std::string path = (dir_ / "w.safetensors").string();
    save_safetensors(path, t);
    return path;
  }
};

TEST_F(StoredQuantDir, BadPartsAreClearErrorsNamingTheTensor) {
  const std::vector<int32_t> words(8, 0);
  const std::vector<uint16_t> scales(8, 0x3f80);
  const int64_t shape[2] = {2, 16};
  const TensorBytes packed{"m.weight_packed", "I32", {2, 2}, words.data(), 16};
  const TensorBytes scale{"m.weight_scale", "BF16", {2, 1}, scales.data(), 4};
  const TensorBytes shape_t{"m.weight_shape", "I64", {2}, shape, 16};
  const ModelConfig c = compressed(4, 16);
  auto refused = [&](const std::vector<TensorBytes>& t, std::initializer_list<std::string> words) {
    const CheckpointTensors ck = CheckpointTensors::open(write(t));
    return testing::throws_error_with([&] { find_stored_quant(ck, c, "m.weight"); }, words);
  };
  EXPECT_TRUE(refused({packed, scale}, {"lacks 'm.weight_shape'", "weight_packed"}));
  EXPECT_TRUE(refused({packed, shape_t}, {"lacks 'm.weight_scale'"}));
  EXPECT_TRUE(refused({{"m.weight_packed", "I16", {2, 4}, words.data(), 16}, scale, shape_t},
                      {"'m.weight_packed' is I16, not I32"}));
  EXPECT_TRUE(refused({packed, {"m.weight_scale", "F16", {2, 1}, scales.data(), 4}, shape_t},
                      {"'m.weight_scale' is F16, not BF16 or F32"}));
  EXPECT_TRUE(refused({packed, scale, shape_t, {"m.weight_g_idx", "I32", {16}, words.data(), 64}},
                      {"'m.weight_g_idx'", "actorder"}));
  // Well formed, it is found, and decodes.
  const CheckpointTensors ck = CheckpointTensors::open(write({packed, scale, shape_t}));
  const auto s = find_stored_quant(ck, c, "m.weight");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(load_stored_quant(ck, *s, DType::f32).get(0), -8.0);  // nibble 0 is q = -8
  // compressed-tensors tensors under a config that says otherwise.
  EXPECT_TRUE(testing::throws_error_with([&] { find_stored_quant(ck, ModelConfig{}, "m.weight"); },
                                         {"quantization_config is absent"}));
  // FP8 without its scales, or with the wrong grid.
  const std::vector<uint8_t> codes(2 * 130, 0x38);
  const std::vector<float> inv(2, 0.5f);
  const TensorBytes fp8{"f.weight", "F8_E4M3", {2, 130}, codes.data(), 260};
  auto fp8_refused = [&](const std::vector<TensorBytes>& t, std::initializer_list<std::string> w) {
    const CheckpointTensors ck = CheckpointTensors::open(write(t));
    return testing::throws_error_with([&] { find_stored_quant(ck, c, "f.weight"); }, w);
  };
  EXPECT_TRUE(fp8_refused({fp8}, {"lacks 'f.weight_scale_inv'", "128"}));
  EXPECT_TRUE(fp8_refused({fp8, {"f.weight_scale_inv", "F32", {2, 1}, inv.data(), 8}},
                          {"'f.weight_scale_inv' has shape [2, 1], not [1, 2]"}));
}

ModelConfig parsed(const nlohmann::json& quantization_config) {
  nlohmann::json j = {{"model_type", "qwen3_moe"},
                      {"vocab_size", 64},
                      {"hidden_size", 32},
                      {"intermediate_size", 48},
                      {"num_hidden_layers", 1},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 8},
                      {"num_experts", 4},
                      {"num_experts_per_tok", 2},
                      {"moe_intermediate_size", 16},
                      {"quantization_config", quantization_config}};
  return parse_model_config(j.dump(), "config.json");
}

nlohmann::json w4a16(nlohmann::json weights_change = nlohmann::json::object()) {
  nlohmann::json weights = {{"num_bits", 4},       {"type", "int"},     {"symmetric", true},
                            {"strategy", "group"}, {"group_size", 128}, {"actorder", nullptr}};
  weights.merge_patch(weights_change);
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", nullptr}}}}},
          {"ignore", {"lm_head", "re:.*mlp.gate$"}}};
}

TEST(StoredQuantConfig, ReadsWeightOnlyIntSchemesAndRefusesOthers) {
  const ModelConfig c = parsed(w4a16());
  EXPECT_EQ(c.quant_method, "compressed-tensors");
  EXPECT_EQ(c.quant_bits, 4);
  EXPECT_EQ(c.quant_group, 128);
  const ModelConfig ch =
      parsed(w4a16({{"num_bits", 8}, {"strategy", "channel"}, {"group_size", nullptr}}));
  EXPECT_EQ(ch.quant_bits, 8);
  EXPECT_EQ(ch.quant_group, 0);
  auto refused = [&](const nlohmann::json& q, std::initializer_list<std::string> words) {
    return testing::throws_error_with([&] { parsed(q); }, words);
  };
  EXPECT_TRUE(refused(w4a16({{"symmetric", false}}), {"group_0.weights", "symmetric int4/int8"}));
  EXPECT_TRUE(refused(w4a16({{"num_bits", 3}}), {"group_0.weights"}));
  EXPECT_TRUE(refused(w4a16({{"actorder", "group"}}), {"group_0.weights"}));
  EXPECT_TRUE(refused(w4a16({{"group_size", nullptr}}), {"group_size is absent"}));
  nlohmann::json w4a8 = w4a16();
  w4a8["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  EXPECT_TRUE(refused(w4a8, {"input_activations quantizes activations", "weights only"}));
  nlohmann::json fp8_ct = w4a16();
  fp8_ct["format"] = "float-quantized";
  EXPECT_TRUE(refused(fp8_ct, {"format is 'float-quantized'"}));
  nlohmann::json frozen = w4a16();
  frozen["quantization_status"] = "frozen";
  EXPECT_TRUE(refused(frozen, {"quantization_status is 'frozen'"}));
  EXPECT_TRUE(refused(
      {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}, {"activation_scheme", "static"}},
      {"activation_scheme is 'static'"}));
  EXPECT_TRUE(refused({{"quant_method", "awq"}}, {"'awq'", "dequantize others"}));
}

}  // namespace
}  // namespace tiermoe
