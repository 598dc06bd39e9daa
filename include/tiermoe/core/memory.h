#pragma once
// Every tensor allocation goes through a MemoryTracker, which keeps live and
// peak bytes per tag. "saved" is what the forward keeps for backward;
// "device" is memory held on the device tier; "mapped" is checkpoint bytes the
// model reads in place from a memory-mapped file (page cache, shared between
// processes, never copied), counted while a view of them is alive.
#include <array>
#include <atomic>
#include <cstddef>
#include <string_view>

namespace tiermoe {

enum class MemTag : uint8_t { weights, grads, optimizer, activations, saved, device, mapped };
inline constexpr size_t kNumMemTags = 7;
std::string_view mem_tag_name(MemTag tag);

class MemoryTracker {
 public:
  MemoryTracker() = default;
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  void on_alloc(MemTag tag, size_t bytes);
  void on_free(MemTag tag, size_t bytes);
  // Moves live bytes from one tag to another (a tensor changing role, e.g. an
  // activation kept for backward becomes "saved").
  void on_retag(MemTag from, MemTag to, size_t bytes);

  size_t live(MemTag tag) const { return slot(tag).live.load(std::memory_order_relaxed); }
  size_t peak(MemTag tag) const { return slot(tag).peak.load(std::memory_order_relaxed); }
  size_t live_total() const { return total_.live.load(std::memory_order_relaxed); }
  size_t peak_total() const { return total_.peak.load(std::memory_order_relaxed); }
  // Peaks restart from the current live bytes (e.g. at the start of a step).
  void reset_peaks();

  // The tracker tensors use when none is given, like a process allocator's
  // statistics. Tests that count bytes exactly pass their own tracker.
  static MemoryTracker& process();

 private:
  struct Counter {
    std::atomic<size_t> live{0};
    std::atomic<size_t> peak{0};
    void add(size_t bytes);
  };
  const Counter& slot(MemTag tag) const { return tags_[size_t(tag)]; }
  Counter& slot(MemTag tag) { return tags_[size_t(tag)]; }

  std::array<Counter, kNumMemTags> tags_;
  Counter total_;
};

}  // namespace tiermoe
