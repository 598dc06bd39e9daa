// SFT batches against the independent PyTorch twin (scripts/fixtures/qwen3_moe_twin.py
// run_sft; cases in tests/data/model/README.md): the rows TierMoE builds from
// tests/data/model/sft/data.jsonl (packing, labels, assistant masks, position
// restarts, padding) equal the twin's, and the loss and every gradient match
// in f64 to the whole-model twin tolerance. Dropping the document mask is
// caught: the loss then moves far past the tolerance, to the twin's value for
// that wrong layout.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/testing.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/model/causal_lm.h"
#include "tiermoe/train/trainer_config.h"

namespace tiermoe {
namespace {

const std::string kFixtures = std::string(TIERMOE_TEST_DATA_DIR) + "/model/";

struct SingleThread {
  SingleThread() { set_num_threads(1); }
  ~SingleThread() { set_num_threads(0); }
};

struct Case {
  nlohmann::json expected;
  CausalLM model;
  TokenBatch batch;
};

Case load_case(const std::string& name) {
  const std::string dir = kFixtures + name;
  nlohmann::json e = nlohmann::json::parse(std::ifstream(dir + "/expected.json"));
  const std::string model_dir = kFixtures + e.at("model").get<std::string>();
  const ModelConfig config = load_model_config(model_dir);
  const int64_t L = e.at("seq_len"), B = e.at("batch");
  auto rows = open_data_file(kFixtures + e.at("data").get<std::string>(), config, L,
                             e.at("packing").get<bool>());
  TokenBatch batch = rows->eval_batch(B, L);
  return {e, CausalLM::from_checkpoint(model_dir, DType::f64), std::move(batch)};
}

// doc ids (0, 0, 1, 1, 1, ...) -> each token's document start (0, 0, 2, 2, 2, ...)
std::vector<int32_t> starts_of(const std::vector<std::vector<int>>& doc) {
  std::vector<int32_t> out;
  for (const auto& row : doc) {
    for (size_t t = 0; t < row.size(); ++t) {
      out.push_back(t > 0 && row[t] == row[t - 1] ? out.back() : int32_t(t));
    }
  }
  return out;
}

template <class T>
std::vector<T> flat(const nlohmann::json& rows) {
  std::vector<T> out;
  for (const auto& r : rows) {
    for (const auto& v : r) out.push_back(T(v.get<int64_t>()));
  }
  return out;
}

void check_case(const std::string& name, bool packed) {
  SingleThread one;
  SCOPED_TRACE(name);
  Case c = load_case(name);
  const nlohmann::json& rows = c.expected.at("rows");
  const TokenBatch& b = c.batch;
  EXPECT_EQ(b.inputs_BL, flat<int32_t>(rows.at("ids")));
  EXPECT_EQ(b.targets_BL, flat<int32_t>(rows.at("targets")));
  EXPECT_EQ(b.layout.positions_BT, flat<int32_t>(rows.at("positions")));
  EXPECT_EQ(b.layout.counted_BT, flat<uint8_t>(rows.at("counted")));
  EXPECT_EQ(b.layout.doc_start_BT, starts_of(rows.at("doc").get<std::vector<std::vector<int>>>()));

  const double loss =
      c.model.forward(b.inputs_BL, b.targets_BL, b.batch, b.seq_len, true, b.layout);
  c.model.backward();
  const double want = c.expected.at("loss");
  EXPECT_NEAR(loss, want, 1e-9 * std::abs(want));
  EXPECT_EQ(c.model.last_loss().targets, c.expected.at("counted_targets").get<int64_t>());
  if (!c.expected.at("aux").is_null()) {
    EXPECT_NEAR(c.model.last_loss().aux, double(c.expected.at("aux")),
                1e-9 * double(c.expected.at("aux")));
  }
  std::printf("  %s: loss %.17g (twin %.17g)\n", name.c_str(), loss, want);

  CheckpointTensors grads = CheckpointTensors::open(kFixtures + name + "/grads.safetensors");
  std::vector<ModelParam> params = c.model.params();
  ASSERT_EQ(params.size(), grads.names().size());
  for (const ModelParam& p : params) {
    Tensor g = grads.load(p.name, DType::f64);
    double max_abs = 0;
    for (int64_t i = 0; i < g.numel(); ++i) max_abs = std::max(max_abs, std::abs(g.get(i)));
    EXPECT_TRUE(testing::all_close(p.grad, g, 1e-9, 1e-9 * max_abs, p.name));
  }

  // Padding is left out of the aux loss (HF's masked means): counting it
  // would give another aux.
  if (!c.expected.at("aux").is_null()) {
    TokenLayout counted_all = b.layout;
    counted_all.counted_BT.assign(counted_all.counted_BT.size(), 1);
    c.model.forward(b.inputs_BL, b.targets_BL, b.batch, b.seq_len, false, counted_all);
    EXPECT_GT(std::abs(c.model.last_loss().aux - double(c.expected.at("aux"))), 1e-6)
        << "counting the padding went unseen";
  }
  // Padding follows the real tokens, so only packed rows depend on the mask.
  if (!packed) return;
  // Attention across a boundary would be caught: without the document mask
  // the loss is the twin's for that wrong layout, far outside the tolerance.
  TokenLayout no_mask = b.layout;
  no_mask.doc_start_BT.assign(no_mask.doc_start_BT.size(), 0);
  const double crossed =
      c.model.forward(b.inputs_BL, b.targets_BL, b.batch, b.seq_len, false, no_mask);
  const double twin_crossed = c.expected.at("loss_without_document_mask");
  EXPECT_NEAR(crossed, twin_crossed, 1e-9 * std::abs(twin_crossed));
  EXPECT_GT(std::abs(crossed - want), 1e4 * 1e-9 * std::abs(want)) << "the mask went unseen";
  // Position restarts cannot be seen once the mask holds: RoPE scores depend
  // on relative positions only, so a document's positions offset by its start
  // give the same attention (the twin agrees to rounding).
  TokenLayout no_restart = b.layout;
  for (size_t i = 0; i < no_restart.positions_BT.size(); ++i) {
    no_restart.positions_BT[i] = int32_t(int64_t(i) % b.seq_len);
  }
  const double shifted =
      c.model.forward(b.inputs_BL, b.targets_BL, b.batch, b.seq_len, false, no_restart);
  EXPECT_NEAR(shifted, double(c.expected.at("loss_without_position_restarts")),
              1e-9 * std::abs(want));
  EXPECT_NEAR(shifted, want, 1e-12 * std::abs(want));
}

TEST(SftTwin, PackedRowsMatchThePytorchTwin) { check_case("sft_moe_packed", true); }
TEST(SftTwin, PackedRowsWithTiedEmbeddingsAndMaskedAuxMatchThePytorchTwin) {
  check_case("sft_dense_tied_aux_packed", true);
}
TEST(SftTwin, PaddedRowsMatchThePytorchTwin) { check_case("sft_moe_padded", false); }

}  // namespace
}  // namespace tiermoe
