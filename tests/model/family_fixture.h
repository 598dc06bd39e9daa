#pragma once
// The family checks' shared pieces (test_families.cpp, test_family_*.cpp):
// a fixture made by scripts/fixtures/make_family_fixture.py
// (tests/data/families/README.md) against TierMoE, in f64. Loss to 1e-9
// relative, each gradient element to 1e-9 * |want| + 1e-9 * max|want| of
// its tensor.
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/test_dir.h"
#include "io/test_safetensors_util.h"
#include "model/model_rig.h"
#include "tiermoe/io/tokens.h"

namespace tiermoe::testing {

inline const std::string kFamilies = std::string(TIERMOE_TEST_DATA_DIR) + "/families/";
inline constexpr double kRtol = 1e-9;

struct FamilyBatch {
  std::vector<int32_t> ids, targets;
  TokenLayout layout;
};

inline std::vector<int32_t> ints(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

// "eval": B windows of tokens.npy; "packed": the rows expected.json holds.
inline FamilyBatch batch_of(const std::string& dir, const nlohmann::json& expected,
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

inline nlohmann::json expected_of(const std::string& dir) {
  return nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
}

inline double forward(CausalLM& model, const nlohmann::json& expected, const FamilyBatch& b,
                      bool grad) {
  const int64_t L = expected.at("seq_len"), B = expected.at("batch");
  return model.forward(b.ids, b.targets, B, L, grad, b.layout);
}

// Loss, its parts and every gradient of `which` against transformers'.
inline void check_family(const std::string& family, const std::string& which) {
  SingleThread one_thread;  // tiny shapes
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
  // Null where the family's loss has no load-balancing term (DeepSeek-V3's).
  ASSERT_EQ(model.last_loss().aux_in_total, !want.at("aux").is_null());
  if (!want.at("aux").is_null()) {
    EXPECT_NEAR(model.last_loss().aux, double(want.at("aux")), kRtol * double(want.at("aux")));
  }
  EXPECT_EQ(model.last_loss().targets, int64_t(want.at("targets")));
  std::printf("  %s %s: loss %.17g (transformers %.17g)\n", family.c_str(), which.c_str(), loss,
              double(want.at("loss")));
  expect_grads_match(model.params(), dir + "/grads_" + which + ".safetensors", kRtol,
                     family + " " + which);
}

// The eval loss with `remove` applied to the model loaded from `dir` (the
// fixture's, or a copy with another config.json): how far from
// transformers', in units of the check's tolerance.
inline double off_by_with(const std::string& family, const std::function<void(CausalLM&)>& remove,
                          const std::string& dir_override = "") {
  SingleThread one_thread;
  const std::string fixture = kFamilies + family;
  const std::string dir = dir_override.empty() ? fixture : dir_override;
  const nlohmann::json expected = expected_of(fixture);
  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  remove(model);
  const double want = expected.at("eval").at("loss");
  const double loss = forward(model, expected, batch_of(fixture, expected, "eval"), false);
  return std::abs(loss - want) / (kRtol * want);
}

// A copy of a family's checkpoint with config.json fields changed.
inline std::string with_config(const std::string& family, const std::filesystem::path& dir,
                               const nlohmann::json& changes) {
  const std::filesystem::path from = kFamilies + family;
  std::filesystem::copy_file(from / "model.safetensors", dir / "model.safetensors");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(from / "config.json"));
  config.merge_patch(changes);
  std::ofstream(dir / "config.json") << config.dump(2);
  return dir.string();
}

// Sets every parameter whose name ends with `suffix` to `value`.
inline void fill_params(CausalLM& model, const std::string& suffix, double value) {
  int n = 0;
  for (ModelParam& p : model.params()) {
    if (!p.name.ends_with(suffix)) continue;
    p.value.fill(value);
    ++n;
  }
  ASSERT_GT(n, 0) << suffix;
}

// A test with its own scratch directory.
class FamilyDir : public DirTest {
 protected:
  FamilyDir() : DirTest("tiermoe_family_", /*threads=*/1) {}
};

// PEFT 0.21's loss with a family's committed adapter (TierMoE's export
// layout: keys under PEFT's module names), and TierMoE's export of the
// loaded adapter is that file, key for key and bit for bit.
inline void expect_peft_loss_and_export(const std::string& family,
                                        const std::filesystem::path& out) {
  SingleThread one_thread;
  const std::string dir = kFamilies + family;
  const nlohmann::json expected = expected_of(dir);
  CausalLM model = CausalLM::from_checkpoint(dir, DType::f64);
  model.load_lora_adapter(dir + "/peft");
  EXPECT_EQ(model.lora_params().size(), 2 * size_t(expected.at("peft").at("adapted_modules")));
  const double want = expected.at("peft").at("loss");
  EXPECT_NEAR(forward(model, expected, batch_of(dir, expected, "eval"), false), want, kRtol * want);

  model.save_lora_adapter(out.string(), DType::f64);
  CheckpointTensors mine = CheckpointTensors::open((out / "adapter_model.safetensors").string());
  CheckpointTensors peft = CheckpointTensors::open(dir + "/peft/adapter_model.safetensors");
  ASSERT_EQ(mine.names(), peft.names());
  for (const std::string& name : peft.names()) {
    EXPECT_TRUE(all_close(mine.load(name, DType::f64), peft.load(name, DType::f64), 0, 0, name));
  }
}

}  // namespace tiermoe::testing
