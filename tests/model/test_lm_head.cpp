// The chunked LM head (model/lm_head.h): loss and every gradient equal the
// one-chunk head in f64 for any chunk size, and the memory the head needs
// while it runs falls with the chunk.
#include "model/model_rig.h"
#include "tiermoe/core/memory.h"
#include "tiermoe/kernels/cross_entropy.h"

namespace tiermoe {
namespace {

using testing::Family;

struct Result {
  double loss;
  std::vector<Tensor> grads;
};

Result run(CausalLM& model, const testing::Batch& b, int64_t chunk) {
  model.set_lm_head_chunk(chunk);
  model.zero_grad();
  Result r{model.forward(b.ids, b.targets, b.B, b.T), {}};
  model.backward();
  for (ModelParam& p : model.params()) r.grads.push_back(p.grad.clone());
  return r;
}

void check_chunks_equal_whole(bool tied) {
  testing::SingleThread one_thread;
  ModelConfig c = testing::tiny_model_config(Family::qwen3, tied, /*norm_topk=*/true);
  CausalLM model(c, DType::f64);
  testing::randomize(model, 7);
  testing::Batch b = testing::make_batch(c.vocab_size, 8, /*B=*/3, /*T=*/7);  // 21 rows
  const Result whole = run(model, b, 0);
  const std::vector<ModelParam> params = model.params();
  for (int64_t chunk : {21, 8, 5, 1}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Result r = run(model, b, chunk);
    EXPECT_NEAR(r.loss, whole.loss, 1e-14 * std::abs(whole.loss));
    for (size_t i = 0; i < params.size(); ++i) {
      double max_abs = 0;
      for (int64_t j = 0; j < whole.grads[i].numel(); ++j) {
        max_abs = std::max(max_abs, std::abs(whole.grads[i].get(j)));
      }
      EXPECT_TRUE(
          testing::all_close(r.grads[i], whole.grads[i], 1e-12, 1e-13 * max_abs, params[i].name));
    }
  }
}

TEST(LmHead, ChunksEqualTheWholeHeadInF64) { check_chunks_equal_whole(/*tied=*/false); }
TEST(LmHead, ChunksEqualTheWholeHeadInF64Tied) { check_chunks_equal_whole(/*tied=*/true); }

// The check can fail: a chunk that drops its last row's target changes the loss.
TEST(LmHead, ADifferentTargetIsSeen) {
  testing::SingleThread one_thread;
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  CausalLM model(c, DType::f64);
  testing::randomize(model, 7);
  testing::Batch b = testing::make_batch(c.vocab_size, 8, 3, 7);
  const double whole = run(model, b, 0).loss;
  b.targets[20] = kIgnoreIndex;
  EXPECT_GT(std::abs(run(model, b, 5).loss - whole), 1e-6);
}

// With a vocabulary large enough to dominate, the activation peak of a
// forward + backward falls with the chunk by the chunk's logits and their
// gradient: 2 * chunk * V * 8 bytes in f64.
TEST(LmHead, PeakFallsWithTheChunk) {
  testing::SingleThread one_thread;
  ModelConfig c = testing::tiny_model_config(Family::qwen3, false, true);
  c.vocab_size = 6000;
  CausalLM model(c, DType::f64);
  testing::randomize(model, 3);
  testing::Batch b = testing::make_batch(c.vocab_size, 4, /*B=*/2, /*T=*/16);  // 32 rows
  MemoryTracker& mt = MemoryTracker::process();
  std::vector<std::pair<int64_t, size_t>> peaks;
  for (int64_t chunk : {32, 16, 8, 2}) {
    run(model, b, chunk);  // warm: gradients allocated
    model.zero_grad();
    mt.reset_peaks();
    const size_t before = mt.live(MemTag::activations);
    model.forward(b.ids, b.targets, b.B, b.T);
    model.backward();
    peaks.emplace_back(chunk, mt.peak(MemTag::activations) - before);
  }
  for (size_t i = 1; i < peaks.size(); ++i) {
    const auto [c0, p0] = peaks[i - 1];
    const auto [c1, p1] = peaks[i];
    std::printf("  chunk %3ld: activation peak %zu bytes\n", long(c1), p1);
    ASSERT_LT(p1, p0) << "chunk " << c1 << " vs " << c0;
    const double want = 2.0 * double(c0 - c1) * double(c.vocab_size) * 8.0;
    EXPECT_NEAR(double(p0 - p1), want, 0.1 * want) << "chunk " << c1 << " vs " << c0;
  }
}

}  // namespace
}  // namespace tiermoe
