#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "tiermoe/core/allocator.h"
#include "tiermoe/core/tensor.h"

using namespace tiermoe;

TEST(HostAllocator, BlockSizesWasteAtMostAnEighth) {
  EXPECT_EQ(HostAllocator::block_size(1), 64u);
  EXPECT_EQ(HostAllocator::block_size(1000), 1024u);
  const size_t mib = size_t(1) << 20;
  EXPECT_EQ(HostAllocator::block_size(mib), mib);
  EXPECT_EQ(HostAllocator::block_size(mib + 1), mib + mib / 8);
  for (size_t bytes : {mib + 7, 3 * mib + 12345, (size_t(100) << 20) + 1}) {
    size_t b = HostAllocator::block_size(bytes);
    EXPECT_GE(b, bytes);
    EXPECT_LE(double(b - bytes), double(bytes) / 8);
  }
}

TEST(HostAllocator, ReusesFreedLargeBlocks) {
  HostAllocator a(size_t(64) << 20);
  const size_t bytes = (size_t(3) << 20) + 100;
  void* p = a.allocate(bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % HostAllocator::kAlign, 0u);
  std::memset(p, 1, bytes);
  a.deallocate(p, bytes);
  EXPECT_EQ(a.cached_bytes(), HostAllocator::block_size(bytes));
  // A request of the same block size gets the same block back.
  void* q = a.allocate(bytes - 50);
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.cached_bytes(), 0u);
  a.deallocate(q, bytes - 50);
  a.release_cached();
  EXPECT_EQ(a.cached_bytes(), 0u);
}

TEST(HostAllocator, CacheStaysUnderItsLimitAndSkipsSmallBlocks) {
  const size_t mib = size_t(1) << 20;
  HostAllocator a(3 * mib);
  void* small = a.allocate(1000);
  a.deallocate(small, 1000);
  EXPECT_EQ(a.cached_bytes(), 0u);
  void* b1 = a.allocate(2 * mib);
  void* b2 = a.allocate(2 * mib);
  a.deallocate(b1, 2 * mib);
  a.deallocate(b2, 2 * mib);  // would exceed 3 MiB: freed instead
  EXPECT_EQ(a.cached_bytes(), 2 * mib);
}

TEST(HostAllocator, ALowerLimitFreesIdleBlocksPastIt) {
  const size_t mib = size_t(1) << 20;
  HostAllocator a(16 * mib);
  void* b1 = a.allocate(2 * mib);
  void* b2 = a.allocate(4 * mib);
  a.deallocate(b1, 2 * mib);
  a.deallocate(b2, 4 * mib);
  EXPECT_EQ(a.cached_bytes(), 6 * mib);
  a.set_cache_limit(3 * mib);  // the 4 MiB block goes, the largest first
  EXPECT_EQ(a.cache_limit(), 3 * mib);
  EXPECT_EQ(a.cached_bytes(), 2 * mib);
  void* b3 = a.allocate(4 * mib);
  a.deallocate(b3, 4 * mib);  // past the new limit: freed
  EXPECT_EQ(a.cached_bytes(), 2 * mib);
}

TEST(HostAllocator, TensorsReuseBlocksAndTrackOnlyLiveBytes) {
  MemoryTracker tracker;
  const void* first;
  {
    Tensor t = Tensor::zeros({1024, 1024}, DType::f32, MemTag::activations, tracker);
    first = t.raw();
  }
  EXPECT_EQ(tracker.live_total(), 0u);
  Tensor t = Tensor::zeros({1024, 1024}, DType::f32, MemTag::activations, tracker);
  EXPECT_EQ(t.raw(), first);
  EXPECT_EQ(t.get(12345), 0.0);  // zeros() still clears a reused block
  EXPECT_EQ(tracker.live_total(), size_t(4) << 20);
}
