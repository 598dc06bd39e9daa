#include "tiermoe/core/memory.h"

namespace tiermoe {

std::string_view mem_tag_name(MemTag tag) {
  switch (tag) {
    case MemTag::weights: return "weights";
    case MemTag::grads: return "grads";
    case MemTag::optimizer: return "optimizer";
    case MemTag::activations: return "activations";
    case MemTag::saved: return "saved";
    case MemTag::device: return "device";
    case MemTag::mapped: return "mapped";
  }
  __builtin_unreachable();
}

void MemoryTracker::Counter::add(size_t bytes) {
  size_t now = live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  size_t prev = peak.load(std::memory_order_relaxed);
  while (now > prev && !peak.compare_exchange_weak(prev, now, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::on_alloc(MemTag tag, size_t bytes) {
  slot(tag).add(bytes);
  total_.add(bytes);
}

void MemoryTracker::on_free(MemTag tag, size_t bytes) {
  slot(tag).live.fetch_sub(bytes, std::memory_order_relaxed);
  total_.live.fetch_sub(bytes, std::memory_order_relaxed);
}

void MemoryTracker::on_retag(MemTag from, MemTag to, size_t bytes) {
  if (from == to) return;
  slot(to).add(bytes);
  slot(from).live.fetch_sub(bytes, std::memory_order_relaxed);
}

void MemoryTracker::reset_peaks() {
  for (auto& c : tags_) c.peak.store(c.live.load());
  total_.peak.store(total_.live.load());
}

MemoryTracker& MemoryTracker::process() {
  static MemoryTracker tracker;
  return tracker;
}

}  // namespace tiermoe
