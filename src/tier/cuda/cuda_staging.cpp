#include "cuda_staging.h"

#include "cuda_check.h"

namespace tiermoe::cuda {

PinnedChunks::PinnedChunks(size_t count, size_t chunk_bytes, const char* what)
    : chunk_bytes_(chunk_bytes), chunks_(count) {
  TIERMOE_ASSERT(count > 0 && chunk_bytes > 0);
  TIERMOE_CUDA(
      cudaHostAlloc(reinterpret_cast<void**>(&base_), count * chunk_bytes, cudaHostAllocDefault),
      what);
  for (size_t i = 0; i < count; ++i) {
    chunks_[i].ptr = base_ + i * chunk_bytes;
    const cudaError_t e = cudaEventCreateWithFlags(&chunks_[i].done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      release();
      throw_cuda(e, "cudaEventCreateWithFlags", what);
    }
  }
}

PinnedChunks::~PinnedChunks() { release(); }

void PinnedChunks::release() {
  for (Chunk& c : chunks_) {
    if (c.done) cudaEventDestroy(c.done);
    c.done = nullptr;
  }
  if (base_) cudaFreeHost(base_);
  base_ = nullptr;
}

PinnedChunks::Chunk& PinnedChunks::next() {
  Chunk& c = chunks_[next_];
  next_ = (next_ + 1) % chunks_.size();
  return c;
}

EventPool::~EventPool() {
  for (cudaEvent_t e : all_) cudaEventDestroy(e);
}

cudaEvent_t EventPool::take() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  TIERMOE_CUDA(cudaEventCreate(&e), "CUDA device events");
  all_.push_back(e);
  return e;
}

}  // namespace tiermoe::cuda
