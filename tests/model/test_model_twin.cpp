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

  CheckpointTensors grads = CheckpointTensors::open(dir + "/grads.safetensors");
  std::vector<ModelParam> params = model.params();
  std::vector<std::string> names;
  for (const ModelParam& p : params) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, grads.names()) << "the parameter sets differ";

  // Worst element over all tensors, as a fraction of its tolerance.
  double worst = 0;
  std::string worst_at;
  for (const ModelParam& p : params) {
    if (!grads.contains(p.name)) continue;
    Tensor want = grads.load(p.name, DType::f64);
    ASSERT_EQ(want.shape(), p.grad.shape()) << p.name;
    double max_abs = 0;
    for (int64_t i = 0; i < want.numel(); ++i) max_abs = std::max(max_abs, std::abs(want.get(i)));
    EXPECT_TRUE(testing::all_close(p.grad, want, 1e-9, 1e-9 * max_abs, p.name));
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double tol = 1e-9 * std::abs(want.get(i)) + 1e-9 * max_abs;
      const double frac = std::abs(p.grad.get(i) - want.get(i)) / tol;
      if (frac > worst) {
        worst = frac;
        worst_at = p.name + "[" + std::to_string(i) + "]: got " + std::to_string(p.grad.get(i)) +
                   ", want " + std::to_string(want.get(i));
      }
    }
  }
  std::printf("  %s: worst gradient element at %.3g of its tolerance: %s\n", name.c_str(), worst,
              worst_at.c_str());
}

TEST(ModelTwin, MoeMatchesThePytorchTwin) { check_twin("moe"); }
TEST(ModelTwin, DenseTiedAuxMatchesThePytorchTwin) { check_twin("dense_tied_aux"); }

}  // namespace
}  // namespace tiermoe
