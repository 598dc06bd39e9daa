#pragma once
// CpuDevice: the Device interface (tier/device.h) on the host CPU. A real
// backend, not a mock: it owns its memory under a byte budget (each buffer
// its own 64-byte-aligned allocation, counted under MemTag::device), reached
// only through buffer handles; its stream is one worker thread that runs
// uploads, downloads, zero fills and graph launches in call order while the
// host goes on computing; kernels on the worker run with exactly
// `threads` OpenMP threads, leaving the host thread's count alone. It is how
// every test checks the device path (docs/architecture.md, "The device tier").
//
// Conventions:
//  - alloc(0) is an Error: a window of nothing is a size bug upstream.
//  - free() of an invalid (id 0) handle does nothing; of an unknown or
//    already freed one it is an Error.
//  - Windows (buffer id, offset + bytes inside the buffer, and for graph
//    arguments slot shape, dtype and alignment) are checked when the call is
//    made, and a bad one throws Error naming the op; nothing is enqueued.
//  - A failure on the stream (a launch that throws, an injected fault) is
//    reported by the next sync() as DeviceError; the ops queued after it up
//    to that sync are skipped (as a poisoned stream would); after sync() the
//    device works again. free() waits for the stream but leaves a failure to
//    sync().
//  - compile() warms the graph up on the worker (the same kernel sequence on
//    zeros), so a launch never creates a oneDNN primitive; it waits for the
//    ops queued before it.
//  - Counters count what the stream has executed (skipped and failed ops are
//    not counted); read them after sync().
//  - The destructor waits for the op in progress and discards the rest (its
//    host pointers need only live until a sync() that will never come).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "tiermoe/core/memory.h"
#include "tiermoe/moe/experts.h"
#include "tiermoe/tier/device.h"

namespace tiermoe {

struct CpuDeviceConfig {
  size_t memory_bytes = size_t(1) << 30;  // the budget capacity() reports
  int threads = 1;                        // OpenMP threads of the worker's kernels, >= 1
  KernelSet kernels = KernelSet::cpu;     // expert kernels: cpu:: or the ref:: oracle
  MemoryTracker* tracker = &MemoryTracker::process();  // device bytes go under MemTag::device
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(CpuDeviceConfig cfg = {});
  ~CpuDevice() override;
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  std::string name() const override { return "cpu"; }
  const CpuDeviceConfig& config() const;

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

  bool holds_quantized() const override { return true; }

  DeviceCounters counters() const override;
  void reset_counters() override;
  void inject(const DeviceFaults& faults) override;

  // Graphs compiled so far (cache misses of compile()).
  int64_t compiles() const;
  // The OpenMP thread count the worker's kernels see (num_threads() on the
  // worker): config().threads, whatever the host thread's count is.
  int kernel_threads() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tiermoe
