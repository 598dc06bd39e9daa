// Each MoE family against transformers 5 itself, in f64: a random tiny
// config saved by transformers' save_pretrained, with the loss and every
// gradient transformers computes on two batches (the eval contract's
// windows, and rows of packed documents with masked targets), made by
// scripts/fixtures/make_family_fixture.py (tests/data/families/README.md).
// Loss to 1e-9 relative, each gradient element to 1e-9 * |want| + 1e-9 *
// max|want| of its tensor. Each family's check is also run with one
// family-specific piece taken out, and must then fail.
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/test_dir.h"
#include "model/model_rig.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe {
namespace {

const std::string kFamilies = std::string(TIERMOE_TEST_DATA_DIR) + "/families/";
constexpr double kRtol = 1e-9;

struct FamilyBatch {
  std::vector<int32_t> ids, targets;
  TokenLayout layout;
};

std::vector<int32_t> ints(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

// "eval": B windows of tokens.npy; "packed": the rows expected.json holds.
FamilyBatch batch_of(const std::string& dir, const nlohmann::json& expected,
                     const std::string& which) {
  const int64_t L = expected.at("seq_len"), B = expected.at("batch");
  FamilyBatch b;
  if (which == "eval") {
    std::vector<int32_t> tokens = read_tokens(dir + "/tokens.npy");
    b.ids.assign(tokens.begin(), tokens.begin() + B * L);
    b.targets.assign(tokens.begin() + 1, tokens.begin() + B * L + 1);
    return b;
  }
  const nlohmann::json& rows = expected.at(which).at("rows");
  b.ids = ints(rows.at("ids"));
  b.targets = ints(rows.at("targets"));
  b.layout.positions_BT = ints(rows.at("positions"));
  b.layout.doc_start_BT = ints(rows.at("doc_start"));
  return b;
}

nlohmann::json expected_of(const std::string& dir) {
  return nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
}

double forward(CausalLM& model, const nlohmann::json& expected, const FamilyBatch& b, bool grad) {
  const int64_t L = expected.at("seq_len"), B = expected.at("batch");
  return model.forward(b.ids, b.targets, B, L, grad, b.layout);
}

// Loss, its parts and every gradient of `which` against transformers'.
void check_family(const std::string& family, const std::string& which) {
  testing::SingleThread one_thread;  // tiny shapes
  SCOPED_TRACE(family + " " + which);
  const std::string dir = kFamilies + family;
  const nlohmann::json expected = expected_of(dir);
  const nlohmann::json& want = expected.at(which);
  const FamilyBatch b = batch_of(dir, expected, which);

  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  const double loss = forward(model, expected, b, /*grad=*/true);
  model.backward();
  EXPECT_NEAR(loss, double(want.at("loss")), kRtol * double(want.at("loss")));
  EXPECT_NEAR(model.last_loss().ce, double(want.at("ce")), kRtol * double(want.at("ce")));
  ASSERT_TRUE(model.last_loss().aux_in_total);
  EXPECT_NEAR(model.last_loss().aux, double(want.at("aux")), kRtol * double(want.at("aux")));
  EXPECT_EQ(model.last_loss().targets, int64_t(want.at("targets")));
  std::printf("  %s %s: loss %.17g (transformers %.17g)\n", family.c_str(), which.c_str(), loss,
              double(want.at("loss")));
  testing::expect_grads_match(model.params(), dir + "/grads_" + which + ".safetensors", kRtol,
                              family + " " + which);
}

// The eval loss with `remove` applied to the loaded model: how far from
// transformers', in units of the check's tolerance.
double off_by_with(const std::string& family, const std::function<void(CausalLM&)>& remove) {
  testing::SingleThread one_thread;
  const std::string dir = kFamilies + family;
  const nlohmann::json expected = expected_of(dir);
  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  remove(model);
  const double want = expected.at("eval").at("loss");
  const double loss = forward(model, expected, batch_of(dir, expected, "eval"), false);
  return std::abs(loss - want) / (kRtol * want);
}

// Sets every parameter whose name ends with `suffix` to `value`.
void fill_params(CausalLM& model, const std::string& suffix, double value) {
  int n = 0;
  for (ModelParam& p : model.params()) {
    if (!p.name.ends_with(suffix)) continue;
    p.value.fill(value);
    ++n;
  }
  ASSERT_GT(n, 0) << suffix;
}

TEST(FamilyQwen2Moe, EvalWindowsMatchTransformers) { check_family("qwen2_moe", "eval"); }
TEST(FamilyQwen2Moe, PackedDocumentsMatchTransformers) { check_family("qwen2_moe", "packed"); }

// The check sees each Qwen2-MoE piece: a shared expert whose gate is a
// constant 1/2 (gate weights 0), no q/k/v bias, no shared expert at all.
TEST(FamilyQwen2Moe, TheCheckFailsWithoutEachQwen2Piece) {
  EXPECT_GT(off_by_with("qwen2_moe",
                        [](CausalLM& m) { fill_params(m, "shared_expert_gate.weight", 0.0); }),
            1e3);
  EXPECT_GT(off_by_with("qwen2_moe", [](CausalLM& m) { fill_params(m, "_proj.bias", 0.0); }), 1e3);
  EXPECT_GT(off_by_with("qwen2_moe",
                        [](CausalLM& m) { fill_params(m, "shared_expert.down_proj.weight", 0.0); }),
            1e3);
  // And nothing removed is within the tolerance (the lambdas above are the only change).
  EXPECT_LT(off_by_with("qwen2_moe", [](CausalLM&) {}), 1.0);
}

// Weights read in place from the checkpoint (LoRA's frozen base) give the
// same loss as copied ones, bit for bit: the shared expert binds like a dense MLP.
TEST(FamilyQwen2Moe, MappedWeightsGiveTheCopiedLoss) {
  testing::SingleThread one_thread;
  const std::string dir = kFamilies + "qwen2_moe";
  const nlohmann::json expected = expected_of(dir);
  const FamilyBatch b = batch_of(dir, expected, "packed");
  CausalLM copied = CausalLM::from_checkpoint(dir, DType::f64);
  CausalLM mapped = CausalLM::from_checkpoint(dir, DType::f64, nullptr, WeightBinding::mapped);
  EXPECT_EQ(forward(copied, expected, b, false), forward(mapped, expected, b, false));
}

// PEFT 0.21's loss with the fixture's adapter (TierMoE's export layout:
// attention, dense MLP and shared expert projections by module-path tail),
// and TierMoE's export of the loaded adapter is that file, key for key.
class FamilyPeft : public testing::DirTest {
 protected:
  FamilyPeft() : DirTest("tiermoe_family_peft_", /*threads=*/1) {}
};

TEST_F(FamilyPeft, Qwen2MoeAdapterGivesPeftsLossAndExportsAsIs) {
  const std::string dir = kFamilies + "qwen2_moe";
  const nlohmann::json expected = expected_of(dir);
  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  model.load_lora_adapter(dir + "/peft");
  EXPECT_EQ(model.lora_params().size(), 2 * size_t(expected.at("peft").at("adapted_modules")));
  const double want = expected.at("peft").at("loss");
  EXPECT_NEAR(forward(model, expected, batch_of(dir, expected, "eval"), false), want, kRtol * want);

  const std::string out = dir_.string();
  model.save_lora_adapter(out, DType::f64);
  CheckpointTensors mine = CheckpointTensors::open(out + "/adapter_model.safetensors");
  CheckpointTensors peft = CheckpointTensors::open(dir + "/peft/adapter_model.safetensors");
  ASSERT_EQ(mine.names(), peft.names());
  for (const std::string& name : peft.names()) {
    EXPECT_TRUE(
        testing::all_close(mine.load(name, DType::f64), peft.load(name, DType::f64), 0, 0, name));
  }
}

}  // namespace
}  // namespace tiermoe
