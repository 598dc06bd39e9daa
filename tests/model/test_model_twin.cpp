// The whole model against an independent PyTorch twin of HF
// Qwen3MoeForCausalLM (scripts/fixtures/qwen3_moe_twin.py; the fixtures and
// what they exercise are described in tests/data/model/README.md): loss and
// every gradient in f64, loss to 1e-9 relative, each gradient element to
// 1e-9 * |want| + 1e-9 * max|want| of its tensor (the README says why the
// floor follows the tensor's scale).
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/model_rig.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/model/causal_lm.h"

namespace tiermoe {
namespace {

const std::string kFixtures = std::string(TIERMOE_TEST_DATA_DIR) + "/model/";

void check_twin(const std::string& name) {
  testing::SingleThread one_thread;  // tiny shapes
  SCOPED_TRACE(name);
  const std::string dir = kFixtures + name;
  nlohmann::json expected = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
  const int64_t L = expected.at("seq_len"), B = expected.at("batch");

  // The eval contract: window i reads [i*L, i*L+L) and predicts the next token of each.
  std::vector<int32_t> tokens = read_tokens(dir + "/tokens.npy");
  ASSERT_GE(int64_t(tokens.size()), B * L + 1);
  std::vector<int32_t> ids(tokens.begin(), tokens.begin() + B * L);
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.begin() + B * L + 1);

  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  const double loss = model.forward(ids, targets, B, L);
  model.backward();

  const double want_loss = expected.at("loss");
  EXPECT_NEAR(loss, want_loss, 1e-9 * std::abs(want_loss));
  EXPECT_NEAR(model.last_loss().ce, double(expected.at("ce")), 1e-9 * double(expected.at("ce")));
  if (!expected.at("aux").is_null()) {
    ASSERT_TRUE(model.last_loss().aux_in_total);
    EXPECT_NEAR(model.last_loss().aux, double(expected.at("aux")), 1e-9 * double(expected.at("aux")));
  }
  std::printf("  %s: loss %.17g (twin %.17g)\n", name.c_str(), loss, want_loss);

  testing::expect_grads_match(model.params(), dir + "/grads.safetensors", 1e-9, name);
}

TEST(ModelTwin, MoeMatchesThePytorchTwin) { check_twin("moe"); }
TEST(ModelTwin, DenseTiedAuxMatchesThePytorchTwin) { check_twin("dense_tied_aux"); }

}  // namespace
}  // namespace tiermoe
