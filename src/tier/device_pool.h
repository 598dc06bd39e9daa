#pragma once
// DevicePool: the sub-allocator that carves a device's one memory arena into
// buffers. A GPU device takes its whole budget from the driver once, at
// start-up (cudaMalloc is slow and synchronising, and a budget taken up
// front cannot be lost to another process later), and hands out byte ranges
// of it from here. The pool knows offsets only and never touches memory, so
// its logic is plain C++ that the host tests hold.
//
// Best fit: a request takes the smallest free block that holds it (the
// lowest offset among equals), so the experts' equal-sized blocks reuse each
// other's holes; a released block merges with free neighbours at once. Every
// block starts at a multiple of kAlign and spans a multiple of it.
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace tiermoe {

class DevicePool {
 public:
  // cudaMalloc's own alignment; cuBLAS and 16-byte vector loads need 16.
  static constexpr size_t kAlign = 256;

  // An arena of `arena_bytes` (rounded down to kAlign), all free.
  explicit DevicePool(size_t arena_bytes);

  // The offset of a new block of at least `bytes` (> 0), or nullopt when no
  // free block holds it (the pool is full, or its free space is in pieces
  // each too small: largest_free() tells which).
  std::optional<size_t> allocate(size_t bytes);
  // Releases the block at `offset`; Error unless it is a live block.
  void release(size_t offset);

  size_t arena_bytes() const { return arena_; }
  size_t allocated_bytes() const { return allocated_; }  // live blocks, rounded up
  size_t free_bytes() const { return arena_ - allocated_; }
  size_t largest_free() const;
  size_t live_blocks() const { return live_.size(); }
  size_t free_blocks() const { return free_by_offset_.size(); }
  // The rounded size of a request: what it takes from the arena.
  static size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  void add_free(size_t offset, size_t bytes);
  void remove_free(std::map<size_t, size_t>::iterator it);

  size_t arena_ = 0, allocated_ = 0;
  std::map<size_t, size_t> free_by_offset_;           // offset -> size
  std::set<std::pair<size_t, size_t>> free_by_size_;  // (size, offset), best fit first
  std::map<size_t, size_t> live_;                     // offset -> rounded size
};

}  // namespace tiermoe
