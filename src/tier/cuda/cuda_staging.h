#pragma once
// The CUDA device's host-side helpers: pinned staging memory cut into chunks
// used round-robin, and a pool of CUDA events.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace tiermoe::cuda {

// Page-locked host memory (cudaHostAlloc), so copies to and from it are DMA
// that overlaps compute. Each chunk carries an event its last use recorded
// and a flag while the lander still has to copy it out.
class PinnedChunks {
 public:
  struct Chunk {
    char* ptr = nullptr;
    cudaEvent_t done = nullptr;  // recorded after the chunk's last DMA
    bool recorded = false;
    bool landing = false;  // download chunks: not yet copied to the caller
  };
  // `count` chunks of `chunk_bytes`; DeviceError when the host cannot pin them.
  PinnedChunks(size_t count, size_t chunk_bytes, const char* what);
  ~PinnedChunks();
  PinnedChunks(const PinnedChunks&) = delete;
  PinnedChunks& operator=(const PinnedChunks&) = delete;

  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t bytes() const { return chunks_.size() * chunk_bytes_; }
  Chunk& next();  // the next chunk in round-robin order

 private:
  void release();

  char* base_ = nullptr;
  size_t chunk_bytes_ = 0, next_ = 0;
  std::vector<Chunk> chunks_;
};

// Timing events, taken per op and given back once the device has synced.
class EventPool {
 public:
  EventPool() = default;
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  cudaEvent_t take();  // DeviceError when a new event cannot be made
  void give_back(cudaEvent_t e) { free_.push_back(e); }

 private:
  std::vector<cudaEvent_t> all_, free_;
};

}  // namespace tiermoe::cuda
