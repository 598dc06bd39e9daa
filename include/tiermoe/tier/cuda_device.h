#pragma once
// The CUDA backend of the device tier: a Device (tier/device.h) on one NVIDIA
// GPU. Built when CMake finds the CUDA toolkit (TIERMOE_CUDA=AUTO|ON|OFF);
// without it these functions still exist and say the backend is absent, so
// callers need no #if.
//
// What the device is (src/tier/cuda/cuda_device.h has the details):
//  - memory: the whole budget is taken from the driver once, at start-up, as
//    one arena, and buffers are carved from it (DevicePool); past the budget,
//    DeviceOutOfMemory, as on the CPU device;
//  - work: uploads, launches and downloads keep the Device contract (as if
//    run in call order) but run on three CUDA streams ordered by events where
//    they touch the same bytes, so the next bucket's upload overlaps the
//    current launch; host bytes pass through pinned staging buffers, and
//    downloads land in the caller's buffers (the layer's rows) before sync()
//    returns;
//  - graphs: each GraphKey is captured once as a CUDA graph (cuBLAS GEMMs in
//    bf16 with f32 accumulation, f32 in f32, f64 in f64; the device's own
//    kernels for the activation, score and bias steps) and replayed per launch;
//  - counters and injected faults kept as the CPU device keeps them (DeviceLedger).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "tiermoe/core/memory.h"
#include "tiermoe/tier/device.h"

namespace tiermoe {

struct CudaDeviceConfig {
  size_t memory_bytes = size_t(1) << 30;  // the budget capacity() reports
  int ordinal = 0;                        // which GPU: cuda:N
  // Pinned host memory for transfers, each way; a transfer larger than this
  // streams through it in chunks.
  size_t staging_bytes = size_t(64) << 20;
  MemoryTracker* tracker = &MemoryTracker::process();  // device bytes go under MemTag::device
};

// Whether this build has the CUDA backend.
bool cuda_backend_built();
// How many GPUs the backend can use: 0 when the build has none, or no driver
// or GPU is present, with the reason in *why.
int cuda_device_count(std::string* why = nullptr);
// One line on GPU `ordinal`: name, compute capability, multiprocessors,
// memory, driver. Error when it cannot be read.
std::string cuda_device_summary(int ordinal);
// A CUDA device. Error naming `flag` with a hint when this build has no
// backend, no GPU is visible, the ordinal is out of range or the budget does
// not fit the GPU.
std::unique_ptr<Device> make_cuda_device(const CudaDeviceConfig& cfg,
                                         std::string_view flag = "--device cuda");

// "none", "cpu", "cuda" or "cuda:N" as --device takes them.
struct DeviceChoice {
  enum class Kind { none, cpu, cuda } kind = Kind::none;
  int ordinal = 0;  // cuda only
};
// Error naming `flag` for anything else.
DeviceChoice parse_device_choice(std::string_view s, std::string_view flag = "--device");

}  // namespace tiermoe
