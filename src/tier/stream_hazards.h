#pragma once
// StreamHazards: which earlier operations a device operation must wait for
// when the device runs its in-order work on several hardware queues at once.
// A GPU device keeps the Device contract (work runs as if in call order) and
// still overlaps it: uploads run on one lane, launches on another, downloads
// on a third, and an operation waits only for the earlier ones it conflicts
// with on memory (read after write, write after read, write after write, by
// byte range within a buffer). So the next bucket's upload into the other
// half of the workspace overlaps the current launch, while an upload into
// rows a queued launch still reads waits for it.
//
// Operations on one lane are ordered by the lane itself and never wait for
// each other here. Plain C++ (sequence numbers and byte ranges), so the host
// tests hold the logic; the device maps a wait to an event.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tiermoe {

enum class Lane : uint8_t { up, compute, down };
inline constexpr int kLanes = 3;

// One operation touching bytes [begin, end) of a buffer.
struct MemAccess {
  uint64_t buffer = 0;
  size_t begin = 0, end = 0;
  bool write = false;
};

// Per lane, the latest earlier operation to wait for; 0: none.
using LaneWaits = std::array<uint64_t, kLanes>;

class StreamHazards {
 public:
  // Registers operation `seq` (increasing from 1) on `lane` and returns what
  // it must wait for on the other lanes. Records an op no later op can need
  // (covered by a later write, or a read repeated on the same lane) are
  // dropped, so the records stay as many as the distinct ranges in use.
  LaneWaits add(uint64_t seq, Lane lane, std::span<const MemAccess> accesses);
  // Every operation registered so far has completed (the device synced).
  void clear() { by_buffer_.clear(); }
  size_t records() const;

 private:
  struct Record {
    size_t begin, end;
    uint64_t seq;
    Lane lane;
    bool write;
  };
  std::unordered_map<uint64_t, std::vector<Record>> by_buffer_;
};

// The time covered by the union of [begin, end) intervals (the lanes' busy
// time, overlapped work counted once).
double covered_seconds(std::vector<std::pair<double, double>> intervals);

}  // namespace tiermoe
