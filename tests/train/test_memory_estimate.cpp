// The host-memory estimate a run is checked against before its first tensor:
// its arithmetic, and that it is a lower bound of what a run allocates (so
// the check refuses only what cannot fit).
#include <gtest/gtest.h>

#include "tiermoe/core/error.h"
#include "tiermoe/core/memory.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/model/memory_estimate.h"
#include "tiermoe/train/metrics.h"
#include "tiermoe/train/trainer_session.h"

namespace tiermoe {
namespace {

size_t peak(const MemorySnapshot& s, MemTag tag) { return s.peak[size_t(tag)]; }

TEST(MemoryEstimate, CountsWeightsGradientsAndOptimizerStateByMode) {
  const ModelConfig c = preset("small");
  const ParamCounts n = param_counts(c);
  const uint64_t P = uint64_t(n.total);

  RunMemoryShape full{
      .dtype = DType::f32, .backward = true, .full_ft = true, .optimizer_states = 2, .tokens = 64};
  HostMemoryEstimate e = estimate_host_memory(c, full, "here");
  EXPECT_EQ(e.weights, 4 * P);
  EXPECT_EQ(e.grads, 4 * P);
  EXPECT_EQ(e.optimizer, 8 * P);  // AdamW's m and v in f32
  // One [64, D] residual stream per layer, and the 64 x V logits of one chunk.
  EXPECT_EQ(e.activations,
            uint64_t(64 * c.hidden_size * c.num_hidden_layers * 4 + 64 * c.vocab_size * 4));
  EXPECT_EQ(e.total(), e.weights + e.grads + e.optimizer + e.activations);

  full.dtype = DType::bf16;  // bf16 weights, f32 gradients, f32 masters beside m and v
  e = estimate_host_memory(c, full, "here");
  EXPECT_EQ(e.weights, 2 * P);
  EXPECT_EQ(e.grads, 4 * P);
  EXPECT_EQ(e.optimizer, 12 * P);

  RunMemoryShape lora{.dtype = DType::f32, .backward = true, .tokens = 64, .lm_head_chunk = 16};
  e = estimate_host_memory(c, lora, "here");
  EXPECT_EQ(e.weights, 4 * P);
  EXPECT_EQ(e.grads + e.optimizer, 0u);
  EXPECT_EQ(e.activations,
            uint64_t(64 * c.hidden_size * c.num_hidden_layers * 4 + 16 * c.vocab_size * 4));

  lora.ranks = 2;  // each rank holds half the experts
  EXPECT_EQ(estimate_host_memory(c, lora, "here").weights, 4 * (P - uint64_t(n.experts) / 2));

  lora.weights_mapped = true;  // a checkpoint's frozen pages: none certain to be resident
  EXPECT_EQ(estimate_host_memory(c, lora, "here").weights, 0u);
}

TEST(MemoryEstimate, AHugeBatchOverflowsIntoAnErrorNotAWrappedSize) {
  RunMemoryShape run{.dtype = DType::f64, .backward = true, .tokens = int64_t(1) << 50};
  try {
    estimate_host_memory(preset("small"), run, "--batch");
    ADD_FAILURE() << "no overflow";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "--batch");
  }
}

TEST(MemoryEstimate, IsALowerBoundOfWhatARunAllocates) {
  set_num_threads(1);
  for (const bool full : {true, false}) {
    for (const DType dtype : {DType::f32, DType::bf16}) {
      TrainConfig c;
      c.preset = "tiny";
      c.layers = 2;
      c.dtype = dtype;
      c.corpus_tokens = 4096;
      c.trainer.steps = 1;
      c.trainer.batch = 2;
      c.trainer.seq_len = 16;
      c.trainer.schedule.warmup_steps = 0;
      if (!full) c.lora = LoraConfig{};
      RunMemoryShape run{.dtype = dtype,
                         .backward = true,
                         .full_ft = full,
                         .optimizer_states = 2,
                         .tokens = 32,
                         .lm_head_chunk = c.lm_head_chunk};
      const HostMemoryEstimate e = estimate_host_memory(preset("tiny", 2), run, "tiny");

      MemoryTracker::process().reset_peaks();
      const MemorySnapshot before = memory_snapshot();
      run_training(c, {});
      const MemorySnapshot s = memory_snapshot();
      const std::string what =
          std::string(full ? "full " : "LoRA ") + std::string(dtype_name(dtype));
      // What was live before the run counts in the peaks: take it off.
      auto during = [&](MemTag t) { return peak(s, t) - before.live[size_t(t)]; };
      EXPECT_GE(during(MemTag::weights), e.weights) << what;
      EXPECT_GE(during(MemTag::grads), e.grads) << what;
      EXPECT_GE(during(MemTag::optimizer), e.optimizer) << what;
      EXPECT_GE(during(MemTag::activations) + during(MemTag::saved), e.activations) << what;
      EXPECT_GT(e.weights, 0u);
    }
  }
}

}  // namespace
}  // namespace tiermoe
