#pragma once
// CudaDevice: the Device interface (tier/device.h) on one NVIDIA GPU
// (tier/cuda_device.h says what it is; this says how).
//
// Memory: one cudaMalloc arena of the budget plus a little slack for the
// pool's 256-byte rounding, carved by a DevicePool. capacity() and used()
// count requested bytes, as the CPU device does, so the planner's budget
// means the same on both; the arena slack, cuBLAS's workspace and each
// graph's argument block and scratch are the device's own (overhead_bytes()).
//
// The stream: calls check their arguments at once (Error naming the op, as
// the CPU device) and queue; a feeder thread issues the queue in order onto
// three CUDA streams (lanes: up, compute, down). Before an op it makes its
// lane wait for the events of the earlier ops on other lanes that touch the
// same bytes (StreamHazards), so the next bucket's upload overlaps the
// current launch and a download overlaps the next launch, while results stay
// those of call order. Host bytes go through pinned staging chunks: an
// upload is copied into a chunk by the feeder and DMA'd from there; a
// download is DMA'd into a chunk and copied into the caller's buffer (the
// layer's rows) by a lander thread as soon as its event completes, so
// sync() returns with every download in place.
//
// Failures: a CUDA error or an injected fault while issuing marks the stream
// failed; the ops queued after it up to sync() are skipped, and sync()
// throws DeviceError once, as on the CPU device. A sticky CUDA error (an
// illegal address) leaves the GPU unusable; every later sync() reports it
// and the tier keeps the work on the host.
//
// Counters: from CUDA events around each op, settled at sync(); busy_s is
// the union of the lanes' busy intervals (overlapped work counts once).
#include <memory>
#include <string>

#include "tiermoe/tier/cuda_device.h"
#include "tiermoe/tier/device.h"

namespace tiermoe::cuda {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const CudaDeviceConfig& cfg);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string name() const override;  // "cuda:N"

  size_t capacity() const override;
  size_t used() const override;
  DeviceBuffer alloc(size_t bytes, BufferUsage usage, std::string_view what) override;
  void free(DeviceBuffer& buf) override;

  void upload(const DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) override;
  void download(void* dst, const DeviceBuffer& src, size_t offset, size_t bytes) override;
  void zero(const DeviceBuffer& dst, size_t offset, size_t bytes) override;
  const Graph& compile(const GraphKey& key) override;
  void launch(const Graph& graph, GraphArgs args) override;
  void sync() override;

  DeviceCounters counters() const override;
  void reset_counters() override;
  void inject(const DeviceFaults& faults) override;

  int64_t compiles() const;       // graphs captured so far (cache misses of compile())
  size_t overhead_bytes() const;  // device memory beside the budget (see above)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tiermoe::cuda
