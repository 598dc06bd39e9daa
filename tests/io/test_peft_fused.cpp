// PEFT 0.21's transformers-5 layout (src/io/peft_fused.h): fused expert
// adapters read into per-expert modules by the exact index rules, and each
// form TierMoE cannot represent refused with the reason. PEFT's own numbers
// are checked in tests/model/test_peft_v5.cpp against a committed fixture.
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/test_safetensors_util.h"
#include "tiermoe/io/peft.h"
#include "tiermoe/io/safetensors.h"

namespace tiermoe {
namespace {

using Json = nlohmann::json;
using testing::TempDir;
using testing::throws_error_with;

constexpr int64_t kE = 3, kD = 4, kF = 2, kR = 1;
const std::string kExperts = "base_model.model.model.layers.0.mlp.experts";

// Values that name their position: A[i][j] = 100 * i + j + 1, B likewise + 0.5.
Tensor indexed(Shape shape, double offset) {
  Tensor t = Tensor::empty(shape, DType::f32);
  for (int64_t i = 0; i < shape[0]; ++i) {
    for (int64_t j = 0; j < shape[1]; ++j) t.set(i * shape[1] + j, 100.0 * i + j + offset);
  }
  return t;
}

Json v5_config() {
  return {{"peft_type", "LORA"},
          {"r", kR},
          {"lora_alpha", 2},
          {"target_modules", Json::array()},
          {"target_parameters", {"gate_up_proj", "down_proj"}},
          {"rank_pattern", {{".*\\.gate_up_proj", 2 * kR}}},
          {"alpha_pattern", {{".*\\.gate_up_proj", 4}}}};
}

// gate_up_proj at rank 2r (A [2rE, D], B [2F, 2rE]) and down_proj at rank r.
NamedTensors v5_tensors(bool block_diagonal) {
  Tensor gu_B = indexed({2 * kF, 2 * kR * kE}, 0.5);
  if (block_diagonal) {
    // Column k*E + e is rank k of expert e; gate rows use rank [0, r), up rows [r, 2r).
    for (int64_t o = 0; o < 2 * kF; ++o) {
      for (int64_t k = 0; k < 2 * kR; ++k) {
        const bool gate_row = o < kF, gate_rank = k < kR;
        if (gate_row != gate_rank) {
          for (int64_t e = 0; e < kE; ++e) gu_B.set(o * 2 * kR * kE + k * kE + e, 0.0);
        }
      }
    }
  }
  return {{kExperts + ".base_layer.lora_A.weight", indexed({2 * kR * kE, kD}, 1)},
          {kExperts + ".base_layer.lora_B.weight", gu_B},
          {kExperts + ".lora_A.weight", indexed({kR * kE, kF}, 1)},
          {kExperts + ".lora_B.weight", indexed({kD, kR * kE}, 0.5)}};
}

void write_adapter(const TempDir& dir, const Json& config, const NamedTensors& tensors) {
  std::ofstream(dir.file(kPeftConfigFile)) << config.dump();
  save_safetensors(dir.file(kPeftWeightsFile), tensors);
}

TEST(PeftFused, ExpertsSplitByPeftsIndexRules) {
  TempDir dir;
  write_adapter(dir, v5_config(), v5_tensors(true));
  PeftAdapter a = load_peft_adapter(dir.path().string());
  EXPECT_EQ(a.config.target_modules,
            (std::vector<std::string>{"down_proj", "gate_proj", "up_proj"}));
  EXPECT_EQ(a.modules.size(), size_t(3 * kE));
  const Tensor gu_A = indexed({2 * kR * kE, kD}, 1), gu_B = v5_tensors(true)[1].second;
  const Tensor dn_A = indexed({kR * kE, kF}, 1), dn_B = indexed({kD, kR * kE}, 0.5);
  for (int64_t e = 0; e < kE; ++e) {
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e);
    const PeftLoraWeights &g = a.modules.at(p + ".gate_proj"), &u = a.modules.at(p + ".up_proj");
    const PeftLoraWeights& d = a.modules.at(p + ".down_proj");
    ASSERT_EQ(g.A_RI.shape(), (Shape{kR, kD}));
    ASSERT_EQ(g.B_OR.shape(), (Shape{kF, kR}));
    ASSERT_EQ(d.A_RI.shape(), (Shape{kR, kF}));
    ASSERT_EQ(d.B_OR.shape(), (Shape{kD, kR}));
    for (int64_t k = 0; k < kR; ++k) {
      // A_e = rows [e*R, (e+1)*R) of the fused A; gate the first r of them, up the last r.
      for (int64_t i = 0; i < kD; ++i) {
        EXPECT_EQ(g.A_RI.get(k * kD + i), gu_A.get((e * 2 * kR + k) * kD + i)) << p;
        EXPECT_EQ(u.A_RI.get(k * kD + i), gu_A.get((e * 2 * kR + kR + k) * kD + i)) << p;
      }
      for (int64_t i = 0; i < kF; ++i) {
        EXPECT_EQ(d.A_RI.get(k * kF + i), dn_A.get((e * kR + k) * kF + i)) << p;
      }
      // B_e's column k is the fused B's column k*E + e.
      for (int64_t o = 0; o < kF; ++o) {
        EXPECT_EQ(g.B_OR.get(o * kR + k), gu_B.get(o * 2 * kR * kE + k * kE + e)) << p;
        EXPECT_EQ(u.B_OR.get(o * kR + k), gu_B.get((kF + o) * 2 * kR * kE + (kR + k) * kE + e))
            << p;
      }
      for (int64_t o = 0; o < kD; ++o) {
        EXPECT_EQ(d.B_OR.get(o * kR + k), dn_B.get(o * kR * kE + k * kE + e)) << p;
      }
    }
  }
}

TEST(PeftFused, FormsTierMoECannotHoldAreRefusedSayingWhich) {
  {
    TempDir dir;  // PEFT-trained: B couples gate and up
    write_adapter(dir, v5_config(), v5_tensors(false));
    EXPECT_TRUE(throws_error_with([&] { load_peft_adapter(dir.path().string()); },
                                  {"couples gate and up", "expert 0", "merge_and_unload",
                                   kExperts + ".base_layer.lora_A/B"}));
  }
  {
    TempDir dir;  // rslora: 2r with alpha 2*alpha is another scaling
    Json c = v5_config();
    c["use_rslora"] = true;
    write_adapter(dir, c, v5_tensors(true));
    EXPECT_TRUE(throws_error_with([&] { load_peft_adapter(dir.path().string()); },
                                  {"gate_up_proj adapter", "scales by", "rslora"}));
  }
  {
    TempDir dir;  // a rank that is neither r nor 2r
    Json c = v5_config();
    c["rank_pattern"] = {{".*\\.gate_up_proj", 3 * kR}};
    c["alpha_pattern"] = {{".*\\.gate_up_proj", 6}};  // the same scaling, 6 / 3
    NamedTensors t = v5_tensors(true);
    t[0].second = indexed({3 * kR * kE, kD}, 1);
    t[1].second = indexed({2 * kF, 3 * kR * kE}, 0.5);
    write_adapter(dir, c, t);
    EXPECT_TRUE(throws_error_with([&] { load_peft_adapter(dir.path().string()); },
                                  {"has rank 3", "rank r (1) or 2r (2)"}));
  }
  {
    TempDir dir;  // down_proj of another rank
    Json c = v5_config();
    c["rank_pattern"][".*\\.down_proj"] = 2;
    c["alpha_pattern"][".*\\.down_proj"] = 4;
    NamedTensors t = v5_tensors(true);
    t[2].second = indexed({2 * kE, kF}, 1);
    t[3].second = indexed({kD, 2 * kE}, 0.5);
    write_adapter(dir, c, t);
    EXPECT_TRUE(throws_error_with([&] { load_peft_adapter(dir.path().string()); },
                                  {"down_proj adapter", "has rank 2", "same rank r"}));
  }
  {
    TempDir dir;  // both targeted, only the inner wrapper stored
    NamedTensors t = v5_tensors(true);
    t.resize(2);
    write_adapter(dir, v5_config(), t);
    EXPECT_TRUE(throws_error_with([&] { load_peft_adapter(dir.path().string()); },
                                  {"the weights lack", kExperts + ".lora_A.weight"}));
  }
  {
    TempDir dir;  // weights for fused experts the config does not target
    Json c = v5_config();
    c["target_parameters"] = Json::array();
    c["target_modules"] = {"q_proj"};
    write_adapter(dir, c, v5_tensors(true));
    EXPECT_TRUE(throws_error_with([&] { load_peft_adapter(dir.path().string()); },
                                  {"names neither gate_up_proj nor down_proj"}));
  }
}

// One fused parameter alone is the only wrapper: its keys are experts.lora_*.
TEST(PeftFused, ALoneTargetIsTheOuterWrapper) {
  TempDir dir;
  Json c = v5_config();
  c["target_parameters"] = {"mlp.experts.down_proj"};
  NamedTensors t = v5_tensors(true);
  write_adapter(dir, c, {t[2], t[3]});
  PeftAdapter a = load_peft_adapter(dir.path().string());
  EXPECT_EQ(a.config.target_modules, (std::vector<std::string>{"down_proj"}));
  EXPECT_EQ(a.modules.size(), size_t(kE));
}

}  // namespace
}  // namespace tiermoe
