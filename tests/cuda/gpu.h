#pragma once
// The GPU tests' gate: each test that needs a GPU starts with
// TIERMOE_REQUIRE_GPU(), which skips it, saying why, on a build without the
// CUDA backend or a machine without a usable GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "graph_cases.h"
#include "tiermoe/tier/cuda_device.h"

#define TIERMOE_REQUIRE_GPU()                                                     \
  do {                                                                            \
    std::string tiermoe_no_gpu_;                                                  \
    if (::tiermoe::cuda_device_count(&tiermoe_no_gpu_) == 0) {                    \
      GTEST_SKIP() << "needs a CUDA GPU, and there is none: " << tiermoe_no_gpu_; \
    }                                                                             \
  } while (0)

namespace tiermoe::testing {

inline std::unique_ptr<Device> gpu(size_t budget, MemoryTracker* tracker = nullptr) {
  CudaDeviceConfig cfg;
  cfg.memory_bytes = budget;
  if (tracker) cfg.tracker = tracker;
  return make_cuda_device(cfg);
}

// Runs a graph through the Device interface: each slot its own buffer,
// uploaded, launched, every slot downloaded back, all freed.
inline GraphRunner device_runner(Device& dev) {
  return [&dev](const GraphKey& key, GraphSlots& slots, bool sum_started) {
    std::vector<DeviceTensor> on_device;
    GraphArgs args;
    for (auto& [name, t] : slots) {
      const DeviceBuffer b = dev.alloc(t.nbytes(), BufferUsage::activations, name);
      on_device.push_back(DeviceTensor{b, 0, t.shape(), t.dtype()});
      upload_tensor(dev, on_device.back(), t);
      args.set(name, on_device.back());
    }
    if (key.kind == GraphKind::expert_bwd_dx_dw) args.ints["sum_started"] = sum_started;
    dev.launch(dev.compile(key), args);
    for (size_t i = 0; i < slots.size(); ++i) download_tensor(dev, slots[i].second, on_device[i]);
    dev.sync();
    for (DeviceTensor& d : on_device) dev.free(d.buffer);
  };
}

}  // namespace tiermoe::testing
