#include "tiermoe/core/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace tiermoe {

struct HostAllocator::Impl {
  size_t limit;
  mutable std::mutex mutex;
  std::multimap<size_t, void*> idle;  // block size -> block
  size_t idle_bytes = 0;

  void free_all() {
    for (auto& [size, p] : idle) std::free(p);
    idle.clear();
    idle_bytes = 0;
  }
};

HostAllocator::HostAllocator(size_t cache_limit) : impl_(new Impl{cache_limit, {}, {}}) {}

HostAllocator::~HostAllocator() {
  impl_->free_all();
  delete impl_;
}

size_t HostAllocator::block_size(size_t bytes) {
  if (bytes < kMinCachedBlock) return (bytes + kAlign - 1) / kAlign * kAlign;
  size_t top = size_t(1) << (63 - __builtin_clzll(bytes));  // largest power of two <= bytes
  size_t step = top / 8;
  return (bytes + step - 1) / step * step;
}

void* HostAllocator::allocate(size_t bytes) {
  const size_t size = block_size(bytes == 0 ? 1 : bytes);
  if (size >= kMinCachedBlock) {
    std::lock_guard lock(impl_->mutex);
    auto it = impl_->idle.find(size);
    if (it != impl_->idle.end()) {
      void* p = it->second;
      impl_->idle.erase(it);
      impl_->idle_bytes -= size;
      return p;
    }
  }
  void* p = std::aligned_alloc(kAlign, size);
  if (!p) {
    release_cached();
    p = std::aligned_alloc(kAlign, size);
  }
  return p;
}

void HostAllocator::deallocate(void* p, size_t bytes) {
  if (!p) return;
  const size_t size = block_size(bytes == 0 ? 1 : bytes);
  if (size >= kMinCachedBlock) {
    std::lock_guard lock(impl_->mutex);
    if (impl_->idle_bytes + size <= impl_->limit) {
      impl_->idle.emplace(size, p);
      impl_->idle_bytes += size;
      return;
    }
  }
  std::free(p);
}

size_t HostAllocator::cached_bytes() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->idle_bytes;
}

void HostAllocator::release_cached() {
  std::lock_guard lock(impl_->mutex);
  impl_->free_all();
}

size_t HostAllocator::cache_limit() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->limit;
}

void HostAllocator::set_cache_limit(size_t bytes) {
  std::lock_guard lock(impl_->mutex);
  impl_->limit = bytes;
  while (impl_->idle_bytes > bytes) {
    auto largest = std::prev(impl_->idle.end());
    std::free(largest->second);
    impl_->idle_bytes -= largest->first;
    impl_->idle.erase(largest);
  }
}

HostAllocator& HostAllocator::process() {
  // Never destroyed: tensors held by other statics may be freed after it.
  static HostAllocator* allocator = new HostAllocator([] {
    const char* env = std::getenv("TIERMOE_HOST_CACHE_BYTES");
    return env ? size_t(std::stoull(env)) : size_t(4) << 30;
  }());
  return *allocator;
}

void trim_malloc_heap() { malloc_trim(0); }

}  // namespace tiermoe
