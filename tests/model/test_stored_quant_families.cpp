// Checkpoints that ship low-bit weights, as their libraries write them
// (scripts/fixtures/make_quant_fixture.py): a Qwen3-MoE packed int4 by
// compressed-tensors, a DeepSeek-V3 and a MiniMax-M2 in block FP8 (its
// experts under Mixtral's w1/w3/w2 names). TierMoE's f64 loss and
// gradients equal transformers' on the same files (loaded with
// dequantize=True); the check fails on a file with one scale doubled; a
// mapped f32 load, which keeps the routed experts at their stored width for
// the quantized kernels, gives the copied f32 load's loss bit for bit.
#include <cstring>
#include <fstream>

#include "model/family_fixture.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

using testing::batch_of;
using testing::check_family;
using testing::expected_of;
using testing::FamilyBatch;
using testing::FamilyDir;
using testing::forward;
using testing::kFamilies;
using testing::off_by_with;

TEST(FamilyQwen3MoeInt4, EvalWindowsMatchTransformers) { check_family("qwen3_moe_int4", "eval"); }
TEST(FamilyDeepseekV3Fp8, EvalWindowsMatchTransformers) { check_family("deepseek_v3_fp8", "eval"); }
TEST(FamilyMinimaxM2Fp8, EvalWindowsMatchTransformers) { check_family("minimax_m2_fp8", "eval"); }

// A copy of `family`'s checkpoint in `dir` with the first scale of tensor
// `name` doubled (its exponent raised by one).
std::string with_scale_doubled(const std::string& family, const std::filesystem::path& dir,
                               const std::string& name) {
  const std::filesystem::path from = kFamilies + family;
  for (const char* f : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(from / f, dir / f);
  }
  const SafetensorsFile file = SafetensorsFile::open((from / "model.safetensors").string());
  const SafetensorsEntry& e = file.entry(name);
  const auto bytes = file.bytes(name);
  std::fstream out(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;  // the data starts after the 8-byte length and the header
  out.read(reinterpret_cast<char*>(&header), 8);
  out.seekp(std::streamoff(8 + header + e.begin));
  if (e.dtype == "BF16") {
    uint16_t v;
    std::memcpy(&v, bytes.data(), 2);
    v = uint16_t(v + (1 << 7));
    out.write(reinterpret_cast<const char*>(&v), 2);
  } else {
    float v;
    std::memcpy(&v, bytes.data(), 4);
    v *= 2;
    out.write(reinterpret_cast<const char*>(&v), 4);
  }
  return dir.string();
}

TEST_F(FamilyDir, TheCheckFailsWithAScaleDoubled) {
  const std::pair<const char*, const char*> cases[] = {
      {"qwen3_moe_int4", "model.layers.1.mlp.experts.0.up_proj.weight_scale"},
      {"qwen3_moe_int4", "model.layers.0.self_attn.q_proj.weight_scale"},
      {"deepseek_v3_fp8", "model.layers.2.mlp.experts.3.down_proj.weight_scale_inv"},
      {"deepseek_v3_fp8", "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"},
      {"minimax_m2_fp8", "model.layers.1.block_sparse_moe.experts.5.w3.weight_scale_inv"},
      {"minimax_m2_fp8", "model.layers.0.self_attn.o_proj.weight_scale_inv"}};
  int i = 0;
  for (const auto& [family, scale] : cases) {
    const std::filesystem::path d = dir_ / std::to_string(i++);
    std::filesystem::create_directories(d);
    EXPECT_GT(off_by_with(
                  family, [](CausalLM&) {}, with_scale_doubled(family, d, scale)),
              1.0)
        << family << " " << scale;
  }
}

TEST(FamilyStoredQuant, MappedExpertsStayQuantizedAndGiveTheCopiedLoss) {
  testing::SingleThread one_thread;
  for (const char* family : {"qwen3_moe_int4", "deepseek_v3_fp8", "minimax_m2_fp8"}) {
    SCOPED_TRACE(family);
    const std::string dir = kFamilies + family;
    const nlohmann::json expected = expected_of(dir);
    const FamilyBatch b = batch_of(dir, expected, "eval");
    CausalLM copied = CausalLM::from_checkpoint(dir, DType::f32);
    CausalLM mapped = CausalLM::from_checkpoint(dir, DType::f32, nullptr, WeightBinding::mapped);
    EXPECT_EQ(copied.stored_quant_counts().kept, 0);
    EXPECT_GT(mapped.stored_quant_counts().kept, 0);
    EXPECT_GT(mapped.stored_quant_counts().widened, 0);  // attention
    for (int64_t l = 0; l < mapped.num_layers(); ++l) {
      if (mapped.layer(l).is_moe()) EXPECT_TRUE(mapped.layer(l).moe()->experts().quantized());
    }
    EXPECT_EQ(forward(copied, expected, b, false), forward(mapped, expected, b, false));
    // And close to the f64 loss (the f32 products' rounding).
    const double want = expected.at("eval").at("loss");
    EXPECT_NEAR(forward(mapped, expected, b, false), want, 1e-5 * want);
  }
}

}  // namespace
}  // namespace tiermoe
