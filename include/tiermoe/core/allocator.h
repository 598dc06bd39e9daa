#pragma once
// Host memory for tensors. Large blocks are cached on free and reused: a
// training step allocates and frees the same large activation buffers every
// step, and handing them back to the kernel costs a page fault and a page
// clear per 4 KiB on the next step (measured: ~30% of a MoE layer step on
// Qwen3 shapes). Small blocks go straight to malloc, whose arenas already
// reuse them. Everything is 64-byte aligned (AMX/AVX-512 loads).
//
// The MemoryTracker counts what tensors hold (live bytes); the cache's idle
// blocks are counted here (cached_bytes) and are not "live".
#include <cstddef>

namespace tiermoe {

class HostAllocator {
 public:
  static constexpr size_t kAlign = 64;
  static constexpr size_t kMinCachedBlock = size_t(1) << 20;  // smaller blocks bypass the cache

  // `cache_limit` bounds the idle bytes kept for reuse.
  explicit HostAllocator(size_t cache_limit);
  ~HostAllocator();
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;

  // Returns a block of at least `bytes` (64-byte aligned), or nullptr when the
  // system is out of memory even after the cache was emptied.
  void* allocate(size_t bytes);
  // `bytes` must be what was passed to allocate().
  void deallocate(void* p, size_t bytes);

  size_t cached_bytes() const;
  void release_cached();  // frees every idle block
  size_t cache_limit() const;
  // Lowers or raises the bound; idle blocks past a lower one are freed.
  void set_cache_limit(size_t bytes);

  // The block size a request is served with: large requests round up to one
  // of 8 steps per power of two, so a reused block wastes at most 1/8.
  static size_t block_size(size_t bytes);

  // The allocator tensors use; its cache limit is TIERMOE_HOST_CACHE_BYTES
  // when set, else 4 GiB.
  static HostAllocator& process();

 private:
  struct Impl;
  Impl* impl_;
};

// Hands the pages malloc holds free (holes between live blocks in its
// arenas) back to the system. glibc keeps them resident, so a loader that
// reads and frees many transient parts calls this as it goes (measured: 4 GB
// resident past the 15.4 GB of int4 experts the full Qwen3-30B-A3B holds).
void trim_malloc_heap();

}  // namespace tiermoe
