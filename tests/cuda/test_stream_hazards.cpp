// StreamHazards, which orders the CUDA device's three lanes: every pair of
// conflicting operations (same bytes, at least one write) ends up ordered,
// disjoint work is not, the double-buffered workspace lets the next upload
// overlap the current launch, and the records stay bounded.
#include <gtest/gtest.h>

#include <vector>

#include "../../src/tier/stream_hazards.h"
#include "tiermoe/core/random.h"

namespace tiermoe {
namespace {

constexpr uint64_t kWs = 1, kWeights = 2;

MemAccess rd(uint64_t buffer, size_t begin, size_t end) { return {buffer, begin, end, false}; }
MemAccess wr(uint64_t buffer, size_t begin, size_t end) { return {buffer, begin, end, true}; }

LaneWaits waits(uint64_t up = 0, uint64_t compute = 0, uint64_t down = 0) {
  return LaneWaits{up, compute, down};
}

TEST(StreamHazards, ReadAfterWriteWriteAfterReadAndWriteAfterWrite) {
  StreamHazards h;
  const std::vector<MemAccess> upload_x = {wr(kWs, 0, 100)};
  const std::vector<MemAccess> launch = {rd(kWs, 0, 100), rd(kWeights, 0, 50), wr(kWs, 100, 200)};
  const std::vector<MemAccess> download_y = {rd(kWs, 100, 200)};
  EXPECT_EQ(h.add(1, Lane::up, upload_x), waits());
  EXPECT_EQ(h.add(2, Lane::compute, launch), waits(1, 0, 0));   // x was written
  EXPECT_EQ(h.add(3, Lane::down, download_y), waits(0, 2, 0));  // y was written
  EXPECT_EQ(h.add(4, Lane::up, upload_x), waits(0, 2, 0));      // x is being read
  EXPECT_EQ(h.add(5, Lane::compute, launch), waits(4, 0, 3));   // x rewritten, y read out
  // Writing y again: after launch 5, which itself waited for download 3.
  EXPECT_EQ(h.add(6, Lane::up, std::vector{wr(kWs, 100, 200)}), waits(0, 5, 0));
}

TEST(StreamHazards, OneLaneNeverWaitsForItselfAndDisjointBytesNeverWait) {
  StreamHazards h;
  EXPECT_EQ(h.add(1, Lane::up, std::vector{wr(kWs, 0, 64)}), waits());
  EXPECT_EQ(h.add(2, Lane::up, std::vector{wr(kWs, 0, 64)}), waits());  // ordered by the lane
  EXPECT_EQ(h.add(3, Lane::compute, std::vector{rd(kWs, 64, 128)}), waits());  // adjacent bytes
  EXPECT_EQ(h.add(4, Lane::compute, std::vector{rd(kWeights, 0, 64)}), waits());
  EXPECT_EQ(h.add(5, Lane::down, std::vector{rd(kWs, 0, 64)}), waits(2, 0, 0));
  EXPECT_EQ(h.add(6, Lane::down, std::vector{rd(kWs, 0, 0)}), waits());  // empty range
}

// TieredExperts alternates launches between two workspace sets: launch i+1's
// upload goes to the other set, so it waits for nothing running; the upload
// of launch i+2 (back to the first set) waits for launch i only, and launch
// i+2, which rewrites the outputs, for launch i's download.
TEST(StreamHazards, TheDoubleBufferedWorkspaceLetsTheNextUploadOverlap) {
  constexpr size_t set_bytes = 1000;
  auto x = [&](int set) { return std::vector{wr(kWs, set * set_bytes, set * set_bytes + 400)}; };
  auto launch = [&](int set) {
    const size_t b = size_t(set) * set_bytes;
    return std::vector{rd(kWs, b, b + 400), rd(kWeights, 0, 100), wr(kWs, b + 400, b + 1000)};
  };
  auto y = [&](int set) {
    return std::vector{rd(kWs, set * set_bytes + 400, set * set_bytes + 1000)};
  };
  StreamHazards h;
  uint64_t seq = 0;
  std::vector<uint64_t> launches, downloads;
  for (int i = 0; i < 6; ++i) {
    const int set = i % 2;
    const LaneWaits up = h.add(++seq, Lane::up, x(set));
    if (i < 2) {
      EXPECT_EQ(up, waits()) << "launch " << i;
    } else {
      EXPECT_EQ(up, waits(0, launches[size_t(i - 2)], 0)) << "launch " << i;
    }
    const uint64_t upload = seq;
    const LaneWaits run = h.add(++seq, Lane::compute, launch(set));
    EXPECT_EQ(run[size_t(Lane::up)], upload) << "launch " << i;
    EXPECT_EQ(run[size_t(Lane::down)], i < 2 ? 0 : downloads[size_t(i - 2)]) << "launch " << i;
    launches.push_back(seq);
    const uint64_t launched = seq;
    EXPECT_EQ(h.add(++seq, Lane::down, y(set)), waits(0, launched, 0)) << "launch " << i;
    downloads.push_back(seq);
  }
}

TEST(StreamHazards, RecordsStayBoundedOverManyLaunches) {
  StreamHazards h;
  uint64_t seq = 0;
  for (int i = 0; i < 10000; ++i) {
    const size_t b = size_t(i % 2) * 1000;
    h.add(++seq, Lane::up, std::vector{wr(kWs, b, b + 400)});
    h.add(++seq, Lane::compute,
          std::vector{rd(kWs, b, b + 400), rd(kWeights + size_t(i % 8), 0, 100),
                      wr(kWs, b + 400, b + 1000)});
    h.add(++seq, Lane::down, std::vector{rd(kWs, b + 400, b + 1000)});
  }
  EXPECT_LE(h.records(), 20u);
  h.clear();
  EXPECT_EQ(h.records(), 0u);
}

// Random operations on random ranges: with the waits returned, plus each
// lane's own order, every conflicting pair is ordered (vector clocks: op Y
// happens before X when X's clock has reached Y on Y's lane).
TEST(StreamHazards, EveryConflictingPairIsOrderedInRandomWork) {
  struct Op {
    Lane lane;
    std::vector<MemAccess> acc;
    LaneWaits clock;
  };
  Rng rng(9);
  StreamHazards h;
  std::vector<Op> ops;
  LaneWaits last_clock[kLanes] = {};
  auto conflict = [](const Op& a, const Op& b) {
    for (const MemAccess& x : a.acc) {
      for (const MemAccess& y : b.acc) {
        if (x.buffer == y.buffer && x.begin < y.end && y.begin < x.end && (x.write || y.write))
          return true;
      }
    }
    return false;
  };
  for (int i = 0; i < 3000; ++i) {
    Op op;
    op.lane = Lane(int(rng.uniform(0, 3)) % 3);
    const int n = 1 + int(rng.uniform(0, 3)) % 3;
    for (int k = 0; k < n; ++k) {
      const size_t b = size_t(rng.uniform(0, 60)), len = 1 + size_t(rng.uniform(0, 20));
      op.acc.push_back(
          {uint64_t(1 + int(rng.uniform(0, 2)) % 2), b, b + len, rng.uniform(0, 1) < 0.5});
    }
    const uint64_t seq = uint64_t(ops.size()) + 1;
    const LaneWaits w = h.add(seq, op.lane, op.acc);
    op.clock = last_clock[size_t(op.lane)];
    for (int l = 0; l < kLanes; ++l) {
      if (!w[size_t(l)]) continue;
      ASSERT_NE(l, int(op.lane));
      const LaneWaits& c = ops[size_t(w[size_t(l)] - 1)].clock;
      for (int k = 0; k < kLanes; ++k)
        op.clock[size_t(k)] = std::max(op.clock[size_t(k)], c[size_t(k)]);
    }
    op.clock[size_t(op.lane)] = seq;
    last_clock[size_t(op.lane)] = op.clock;
    for (size_t j = 0; j < ops.size(); ++j) {
      if (!conflict(ops[j], op)) continue;
      ASSERT_GE(op.clock[size_t(ops[j].lane)], j + 1)
          << "op " << seq << " may overtake op " << j + 1;
    }
    ops.push_back(std::move(op));
  }
}

TEST(StreamHazards, CoveredSecondsCountsOverlapsOnce) {
  EXPECT_DOUBLE_EQ(covered_seconds({}), 0.0);
  EXPECT_DOUBLE_EQ(covered_seconds({{0, 1}, {2, 3}}), 2.0);
  EXPECT_DOUBLE_EQ(covered_seconds({{0, 2}, {1, 3}, {0.5, 1.5}}), 3.0);
  EXPECT_DOUBLE_EQ(covered_seconds({{5, 6}, {0, 10}, {3, 4}}), 10.0);
  EXPECT_DOUBLE_EQ(covered_seconds({{1, 1}, {2, 1}}), 0.0);
}

}  // namespace
}  // namespace tiermoe
