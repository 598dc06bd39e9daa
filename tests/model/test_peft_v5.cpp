// Adapters that PEFT 0.21 writes for a transformers-5 Qwen3-MoE model (fused
// experts adapted through target_parameters, rank_pattern / alpha_pattern),
// read by --lora-init with PEFT's semantics. The fixture
// (tests/data/peft_v5, scripts/fixtures/make_peft_v5_fixture.py) holds PEFT's
// own merged deltas (get_delta_weight) and the loss PEFT's model gives.
#include <gmock/gmock.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model_rig.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

using ::testing::HasSubstr;

const std::string kDir = std::string(TIERMOE_TEST_DATA_DIR) + "/peft_v5/";

nlohmann::json expected(const std::string& adapter) {
  std::ifstream in(kDir + adapter + "/expected.json");
  return nlohmann::json::parse(in);
}

// The fixture's windows under the eval contract: [i*L, i*L+L) -> [i*L+1, ...).
double fixture_loss(CausalLM& m, const nlohmann::json& want) {
  const int64_t B = want.at("batch"), T = want.at("seq_len");
  std::vector<int32_t> tokens = read_tokens(kDir + "tokens.npy");
  std::vector<int32_t> ids(tokens.begin(), tokens.begin() + B * T);
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.begin() + B * T + 1);
  return m.forward(ids, targets, B, T, /*grad=*/false);
}

// Every adapted module's delta, as TierMoE merges it into a zero weight,
// against PEFT's: 2-D modules by path, experts under the fused names.
void expect_deltas_match(CausalLM& m, const std::string& adapter) {
  SafetensorsFile peft = SafetensorsFile::open(kDir + adapter + "/merged.safetensors");
  size_t compared = 0, entries = 0;
  for (int64_t l = 0; l < m.num_layers(); ++l) {
    DecoderLayer& layer = m.layer(l);
    for (LoraAdapter* a : layer.lora_adapters()) {
      Tensor delta = Tensor::zeros({a->out(), a->in()}, DType::f64);
      a->merge(delta);
      EXPECT_TRUE(testing::all_close(delta, peft.load(a->name(), DType::f64), 1e-13, 1e-15))
          << a->name();
      ++compared;
      ++entries;
    }
    ExpertLora* ex = layer.moe()->lora();
    ASSERT_NE(ex, nullptr);
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    Tensor gate_up = peft.load(p + "gate_up_proj", DType::f64);
    Tensor down = peft.load(p + "down_proj", DType::f64);
    const int64_t F = m.config().moe_intermediate_size, D = m.config().hidden_size;
    for (int64_t e = 0; e < ex->num_experts(); ++e) {
      Tensor gate = Tensor::zeros({F, D}, DType::f64), up = Tensor::zeros({F, D}, DType::f64);
      Tensor dn = Tensor::zeros({D, F}, DType::f64);
      ex->merge(ExpertProj::gate, e, gate);
      ex->merge(ExpertProj::up, e, up);
      ex->merge(ExpertProj::down, e, dn);
      const std::string at = p + std::to_string(e);
      EXPECT_TRUE(testing::all_close(gate, gate_up.select(e).rows(0, F), 1e-13, 1e-15)) << at;
      EXPECT_TRUE(testing::all_close(up, gate_up.select(e).rows(F, 2 * F), 1e-13, 1e-15)) << at;
      EXPECT_TRUE(testing::all_close(dn, down.select(e), 1e-13, 1e-15)) << at;
      compared += 3;
    }
    entries += 2;
  }
  EXPECT_EQ(entries, peft.entries().size());  // every delta PEFT has was compared
  EXPECT_GT(compared, size_t(20));
}

// PEFT's model computes RMSNorm statistics, RoPE and the softmaxes in fp32
// even in a float64 model (TierMoE's f64 mode does not), so losses agree to
// about 1e-7 here; the adapters move the loss by 0.1 or more.
constexpr double kLossRtol = 2e-6;

class PeftV5 : public ::testing::TestWithParam<const char*> {};

TEST_P(PeftV5, LoraInitReadsTheFusedAdapterAsPeftAppliesIt) {
  testing::SingleThread one_thread;  // tiny shapes
  const std::string adapter = GetParam();
  const nlohmann::json want = expected(adapter);
  CausalLM m = CausalLM::from_checkpoint(kDir + "model", DType::f64);  // the fused layout
  EXPECT_NEAR(fixture_loss(m, want), want.at("base_loss").get<double>(),
              kLossRtol * want.at("base_loss").get<double>());
  m.load_lora_adapter(kDir + adapter);
  const LoraConfig& cfg = m.lora_config();
  EXPECT_EQ(cfg.rank, 2);
  EXPECT_EQ(cfg.alpha, 4);
  EXPECT_TRUE(cfg.targets.contains("gate_proj") && cfg.targets.contains("up_proj") &&
              cfg.targets.contains("down_proj"));
  expect_deltas_match(m, adapter);
  const double loss = fixture_loss(m, want);
  EXPECT_NEAR(loss, want.at("loss").get<double>(), kLossRtol * want.at("loss").get<double>());
  EXPECT_GT(std::abs(loss - want.at("base_loss").get<double>()), 0.1);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PeftV5, ::testing::Values("converted", "direct"));

// PEFT training on the fused layout leaves gate_up_proj's rank-2r B dense:
// gate and up share every A row, which TierMoE's separate rank-r gate_proj
// and up_proj adapters cannot hold. Refused, saying so.
TEST(PeftV5Refused, ADenseFusedGateUpAdapterIsRefusedSayingWhy) {
  testing::SingleThread one_thread;
  CausalLM m = CausalLM::from_checkpoint(kDir + "model", DType::f64);
  try {
    m.load_lora_adapter(kDir + "trained");
    ADD_FAILURE() << "the trained fused adapter loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), HasSubstr("couples gate and up"));
    EXPECT_THAT(e.message(), HasSubstr("model.layers.0.mlp.experts.gate_up_proj"));
    EXPECT_THAT(e.where(), HasSubstr("adapter_model.safetensors"));
    EXPECT_THAT(e.hint(), HasSubstr("merge_and_unload"));
  }
  EXPECT_FALSE(m.has_lora());
}

}  // namespace
}  // namespace tiermoe
