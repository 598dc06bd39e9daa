#include "device_pool.h"

#include <iterator>

#include "tiermoe/core/error.h"

namespace tiermoe {

DevicePool::DevicePool(size_t arena_bytes) : arena_(arena_bytes / kAlign * kAlign) {
  if (arena_ > 0) add_free(0, arena_);
}

void DevicePool::add_free(size_t offset, size_t bytes) {
  free_by_offset_.emplace(offset, bytes);
  free_by_size_.emplace(bytes, offset);
}

void DevicePool::remove_free(std::map<size_t, size_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::optional<size_t> DevicePool::allocate(size_t bytes) {
  TIERMOE_ASSERT(bytes > 0, "a device block of 0 bytes");
  if (bytes > arena_) return std::nullopt;
  const size_t want = rounded(bytes);
  auto fit = free_by_size_.lower_bound({want, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const auto [size, offset] = *fit;
  remove_free(free_by_offset_.find(offset));
  if (size > want) add_free(offset + want, size - want);
  live_.emplace(offset, want);
  allocated_ += want;
  return offset;
}

void DevicePool::release(size_t offset) {
  auto it = live_.find(offset);
  TIERMOE_CHECK(it != live_.end(),
                detail::str_of("release of offset ", offset, ", which is not a live block"),
                "DevicePool", "release each block once, at the offset allocate() returned");
  size_t begin = offset, bytes = it->second;
  allocated_ -= bytes;
  live_.erase(it);
  // Merge with the free block right after, then the one right before.
  auto next = free_by_offset_.lower_bound(begin);
  if (next != free_by_offset_.end() && next->first == begin + bytes) {
    bytes += next->second;
    remove_free(next);
  }
  auto after = free_by_offset_.lower_bound(begin);
  if (after != free_by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      bytes += prev->second;
      remove_free(prev);
    }
  }
  add_free(begin, bytes);
}

size_t DevicePool::largest_free() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

}  // namespace tiermoe
