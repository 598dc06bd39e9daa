// Which experts the model runs on the grouped kernels (moe/expert_kernels.h):
// frozen ones (LoRA runs, whose weights never change) and not trainable ones,
// whose every optimizer step would re-pack all of a layer's weights; and the
// host-memory rule that keeps packs from running a large frozen model out of
// memory. Both paths give the same bits (tests/moe/test_expert_kernels.cpp),
// so only the choice is tested here.
#include <gtest/gtest.h>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/memory.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/model/moe_block.h"
#include "tiermoe/moe/dispatch.h"
#include "tiermoe/moe/expert_kernels.h"

namespace tiermoe {
namespace {

TEST(ExpertPacks, OnlyFrozenExpertsRunGrouped) {
  const ModelConfig config = preset("tiny");
  LocalDispatcher dispatcher;
  MoeBlock block(config, DType::bf16, dispatcher, "model.layers.0.mlp");
  ASSERT_TRUE(block.experts_requires_grad());
  EXPECT_FALSE(ExpertPacks::applies(block.experts())) << "trainable experts would re-pack each step";
  block.set_experts_requires_grad(false);
  EXPECT_TRUE(ExpertPacks::applies(block.experts())) << "frozen experts pack once";
  block.set_experts_requires_grad(true);
  EXPECT_FALSE(ExpertPacks::applies(block.experts()));
}

TEST(ExpertPacks, PacksMustFitHalfTheHostMemory) {
  // 1,000 bytes of stacks pack into about 2,250; half the memory must hold that.
  EXPECT_TRUE(ExpertPacks::packs_fit(1000, 4500));
  EXPECT_FALSE(ExpertPacks::packs_fit(1000, 4498));
  EXPECT_FALSE(ExpertPacks::packs_fit(uint64_t(60) << 30, uint64_t(100) << 30))
      << "Qwen3-30B-A3B's 60 GB of bf16 experts on a 100 GB host";
}

// MemAvailable counts a mapped checkpoint's resident pages as reclaimable;
// the packs must leave them be, or the step re-reads the checkpoint from
// disk. With (pretend) mapped bytes of all the memory available, nothing packs.
TEST(ExpertPacks, MappedCheckpointBytesAreNotThePacks) {
  const ModelConfig config = preset("tiny");
  LocalDispatcher dispatcher;
  {
    MoeBlock block(config, DType::bf16, dispatcher, "model.layers.0.mlp");
    block.set_experts_requires_grad(false);
    EXPECT_TRUE(ExpertPacks::applies(block.experts()));
  }
  const uint64_t mapped = host_memory_available();
  MemoryTracker::process().on_alloc(MemTag::mapped, mapped);
  MoeBlock block(config, DType::bf16, dispatcher, "model.layers.0.mlp");
  block.set_experts_requires_grad(false);
  const bool applies = ExpertPacks::applies(block.experts());
  MemoryTracker::process().on_free(MemTag::mapped, mapped);
  EXPECT_FALSE(applies) << "the packs took the mapped checkpoint's memory";
  EXPECT_TRUE(block.experts().packs().pack_refused());
}

}  // namespace
}  // namespace tiermoe
