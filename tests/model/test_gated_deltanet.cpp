// The Gated DeltaNet layer (model/gated_deltanet.h) against one of
// transformers' own (Qwen3_5MoeGatedDeltaNet, saved with its output and
// gradients by scripts/fixtures/make_gated_deltanet_fixture.py) in f64, the
// check shown to fail on a broken input, and packed documents equal to each
// document alone through the whole layer.
#include <gtest/gtest.h>

#include <cstring>

#include "common/testing.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/model/gated_deltanet.h"

using namespace tiermoe;
using namespace tiermoe::testing;

namespace {

const std::string kLayer = std::string(TIERMOE_TEST_DATA_DIR) + "/gated_delta/layer.safetensors";

Tensor load_f64(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry& e = f.entry(name);
  Tensor t = Tensor::empty(e.shape, DType::f64);
  const auto bytes = f.bytes(name);
  std::memcpy(t.data<double>(), bytes.data(), bytes.size());
  return t;
}

GatedDeltaNetDims dims_of(const SafetensorsFile& f) {
  const auto bytes = f.bytes("dims");
  int64_t d[6];
  std::memcpy(d, bytes.data(), sizeof d);
  return {.hidden = d[0],
          .key_heads = d[1],
          .key_dim = d[2],
          .value_heads = d[3],
          .value_dim = d[4],
          .conv_kernel = d[5],
          .norm_eps = 1e-5};
}

// The layer with the fixture's weights.
GatedDeltaNet layer_of(const SafetensorsFile& f) {
  GatedDeltaNet layer(dims_of(f), DType::f64);
  for (auto& [name, w] : layer.weights()) w->value.copy_from(load_f64(f, name));
  return layer;
}

RopeTables rows_of(int64_t B, int64_t T, std::vector<int32_t> doc_start = {}) {
  RopeTables r;
  r.B = B, r.T = T, r.doc_start_BT = std::move(doc_start);
  return r;
}

TEST(GatedDeltaNetLayer, EqualsTransformersLayerInF64) {
  const SafetensorsFile f = SafetensorsFile::open(kLayer);
  GatedDeltaNet layer = layer_of(f);
  const Tensor x = load_f64(f, "x");
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
  const RopeTables rows = rows_of(B, T);
  AttentionSaved saved;
  Tensor y = Tensor::empty({B * T, D}, DType::f64);
  layer.forward(y, x.view({B * T, D}), rows, saved);
  EXPECT_TRUE(all_close(y, load_f64(f, "y").view({B * T, D}), 1e-12, 1e-13, "y"));
  Tensor dx = Tensor::empty({B * T, D}, DType::f64);
  layer.backward(dx, load_f64(f, "P").view({B * T, D}), rows, saved, false);
  EXPECT_TRUE(all_close(dx, load_f64(f, "dx").view({B * T, D}), 1e-11, 1e-12, "dx"));
  for (auto& [name, w] : layer.weights()) {
    EXPECT_TRUE(all_close(w->grad, load_f64(f, "d" + name), 1e-11, 1e-12, "d" + name));
  }
  // The comparison sees the short convolution: a layer without it is far off.
  ASSERT_EQ(layer.weights()[2].first, "conv1d.weight");
  layer.weights()[2].second->value.zero();
  AttentionSaved off_saved;
  Tensor off = Tensor::empty({B * T, D}, DType::f64);
  layer.forward(off, x.view({B * T, D}), rows, off_saved);
  EXPECT_FALSE(all_close(off, load_f64(f, "y").view({B * T, D}), 1e-6, 1e-8, "y without conv"));
}

// Two documents packed in a row give what each gives alone, bitwise: neither
// the convolution nor the rule's state crosses the boundary.
TEST(GatedDeltaNetLayer, PackedDocumentsEqualEachAlone) {
  const SafetensorsFile f = SafetensorsFile::open(kLayer);
  const GatedDeltaNet layer = layer_of(f);
  const Tensor x = load_f64(f, "x");
  const int64_t T = x.size(1), D = x.size(2);
  const Tensor row = x.rows(0, 1).view({T, D});
  std::vector<int32_t> starts(size_t(T), 0);
  for (int64_t t = 3; t < T; ++t) starts[size_t(t)] = 3;
  AttentionSaved saved;
  Tensor packed = Tensor::empty({T, D}, DType::f64);
  layer.forward(packed, row, rows_of(1, T, starts), saved);
  for (const auto& [from, len] : {std::pair<int64_t, int64_t>{0, 3}, {3, T - 3}}) {
    Tensor alone = Tensor::empty({len, D}, DType::f64);
    AttentionSaved s;
    layer.forward(alone, row.rows(from, from + len).clone(), rows_of(1, len), s);
    EXPECT_TRUE(bitwise_equal(alone, packed.rows(from, from + len).clone(), "document alone"));
  }
}

}  // namespace
