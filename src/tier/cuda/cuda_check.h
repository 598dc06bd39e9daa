#pragma once
// CUDA runtime and cuBLAS status checks: a failed call throws DeviceError
// naming the call, the CUDA error and where.
#include <cuda_runtime.h>

#include <string>

#include "tiermoe/tier/device.h"

namespace tiermoe::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* call, const std::string& where) {
  throw DeviceError(
      detail::str_of(call, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"),
      where, "a CUDA call failed; the GPU or its driver reported the error above");
}

}  // namespace tiermoe::cuda

// Throws DeviceError unless `call` returns cudaSuccess.
#define TIERMOE_CUDA(call, where)                                        \
  do {                                                                   \
    const cudaError_t tiermoe_cuda_status_ = (call);                     \
    if (tiermoe_cuda_status_ != cudaSuccess) [[unlikely]] {              \
      ::tiermoe::cuda::throw_cuda(tiermoe_cuda_status_, #call, (where)); \
    }                                                                    \
  } while (0)
