// DevicePool, the sub-allocator of the CUDA device's arena: aligned,
// disjoint blocks inside the arena, best fit, coalescing on release, and a
// long random sequence checked against a byte map of the arena.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "../../src/tier/device_pool.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/random.h"

namespace tiermoe {
namespace {

constexpr size_t A = DevicePool::kAlign;

TEST(DevicePool, BlocksAreAlignedDisjointAndInsideTheArena) {
  DevicePool pool(100 * A + 17);  // the ragged end is not handed out
  EXPECT_EQ(pool.arena_bytes(), 100 * A);
  std::vector<std::pair<size_t, size_t>> blocks;
  for (size_t bytes : {1ul, A, A + 1, 7 * A - 3, 3 * A}) {
    const auto off = pool.allocate(bytes);
    ASSERT_TRUE(off.has_value()) << bytes;
    EXPECT_EQ(*off % A, 0u);
    blocks.emplace_back(*off, DevicePool::rounded(bytes));
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 0; i + 1 < blocks.size(); ++i) {
    EXPECT_LE(blocks[i].first + blocks[i].second, blocks[i + 1].first);
  }
  EXPECT_LE(blocks.back().first + blocks.back().second, pool.arena_bytes());
  EXPECT_EQ(pool.allocated_bytes(), (1 + 1 + 2 + 7 + 3) * A);
  EXPECT_EQ(pool.live_blocks(), 5u);
}

TEST(DevicePool, ReleasedBlocksMergeBackIntoOne) {
  DevicePool pool(64 * A);
  std::vector<size_t> offs;
  for (int i = 0; i < 8; ++i) offs.push_back(*pool.allocate(8 * A));
  EXPECT_FALSE(pool.allocate(1).has_value());  // full
  // Release in an order that merges left, right and both ways.
  for (int i : {1, 3, 2, 6, 7, 0, 5, 4}) pool.release(offs[size_t(i)]);
  EXPECT_EQ(pool.free_blocks(), 1u);
  EXPECT_EQ(pool.largest_free(), 64 * A);
  EXPECT_EQ(pool.allocated_bytes(), 0u);
  EXPECT_EQ(*pool.allocate(64 * A), 0u);
}

TEST(DevicePool, BestFitTakesTheSmallestHoleThatHolds) {
  DevicePool pool(40 * A);
  const size_t a = *pool.allocate(10 * A), b = *pool.allocate(2 * A), c = *pool.allocate(4 * A),
               d = *pool.allocate(2 * A), e = *pool.allocate(5 * A), f = *pool.allocate(2 * A);
  (void)b, (void)d, (void)f;
  pool.release(a);                      // a hole of 10
  pool.release(c);                      // a hole of 4
  pool.release(e);                      // a hole of 5; 15 free at the end
  EXPECT_EQ(*pool.allocate(4 * A), c);  // exact fit
  EXPECT_EQ(*pool.allocate(5 * A), e);
  EXPECT_EQ(*pool.allocate(3 * A), a);  // the 10-hole beats the 15 at the end
}

TEST(DevicePool, FragmentedFreeSpaceRefusesWhatNoHoleHolds) {
  DevicePool pool(12 * A);
  std::vector<size_t> offs;
  for (int i = 0; i < 6; ++i) offs.push_back(*pool.allocate(2 * A));
  for (int i : {0, 2, 4}) pool.release(offs[size_t(i)]);
  EXPECT_EQ(pool.free_bytes(), 6 * A);
  EXPECT_EQ(pool.largest_free(), 2 * A);
  EXPECT_FALSE(pool.allocate(3 * A).has_value());
  EXPECT_TRUE(pool.allocate(2 * A).has_value());
  EXPECT_FALSE(pool.allocate(13 * A).has_value());
}

TEST(DevicePool, ReleasingWhatIsNotABlockIsAnError) {
  DevicePool pool(8 * A);
  const size_t off = *pool.allocate(A);
  EXPECT_THROW(pool.release(off + A), Error);
  pool.release(off);
  EXPECT_THROW(pool.release(off), Error);
}

// Random allocations and releases against a map of the arena's units: every
// block is free before and owned after; allocate fails exactly when no run of
// free units holds the request; the pool's books match the map.
TEST(DevicePool, RandomSequenceMatchesAByteMap) {
  constexpr size_t units = 512;
  DevicePool pool(units * A);
  std::vector<int> owner(units, -1);
  std::map<size_t, size_t> live;  // offset -> units
  Rng rng(41);
  auto longest_free_run = [&] {
    size_t best = 0, run = 0;
    for (int o : owner) {
      run = o < 0 ? run + 1 : 0;
      best = std::max(best, run);
    }
    return best;
  };
  for (int step = 0; step < 4000; ++step) {
    const bool grow = live.empty() || rng.uniform(0, 1) < 0.55;
    if (grow) {
      const size_t bytes = size_t(rng.uniform(1, 40.0 * A));
      const size_t want = DevicePool::rounded(bytes) / A;
      const bool fits = longest_free_run() >= want;
      const auto off = pool.allocate(bytes);
      ASSERT_EQ(off.has_value(), fits) << "step " << step << ", " << want << " units";
      if (!off) continue;
      ASSERT_EQ(*off % A, 0u);
      for (size_t u = *off / A; u < *off / A + want; ++u) {
        ASSERT_EQ(owner[u], -1) << "step " << step << ": unit " << u << " handed out twice";
        owner[u] = step;
      }
      live.emplace(*off, want);
    } else {
      auto it = live.begin();
      std::advance(it, int64_t(rng.uniform(0, double(live.size()))) % int64_t(live.size()));
      pool.release(it->first);
      for (size_t u = it->first / A; u < it->first / A + it->second; ++u) owner[u] = -1;
      live.erase(it);
    }
    size_t used = 0;
    for (const auto& [off, n] : live) used += n * A;
    ASSERT_EQ(pool.allocated_bytes(), used);
    ASSERT_EQ(pool.largest_free(), longest_free_run() * A);
  }
}

}  // namespace
}  // namespace tiermoe
