// The CUDA backend's entry points (tier/cuda_device.h) in a build with it.
#include <cuda_runtime.h>

#include "cuda_device.h"

namespace tiermoe {

namespace {

using detail::str_of;

std::string cuda_error(cudaError_t e) {
  return str_of(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

}  // namespace

bool cuda_backend_built() { return true; }

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = "no CUDA GPU is usable: cudaGetDeviceCount says " + cuda_error(e);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA GPU is visible to the driver";
  return n;
}

std::string cuda_device_summary(int ordinal) {
  cudaDeviceProp p{};
  const cudaError_t e = cudaGetDeviceProperties(&p, ordinal);
  TIERMOE_CHECK(e == cudaSuccess,
                "cannot read GPU " + std::to_string(ordinal) + ": " + cuda_error(e), "CUDA",
                "check the GPU with nvidia-smi");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  return str_of(p.name, " (compute capability ", p.major, ".", p.minor, ", ", p.multiProcessorCount,
                " SMs, ", p.totalGlobalMem >> 20, " MiB), driver ", driver / 1000, ".",
                driver % 1000 / 10, ", runtime ", runtime / 1000, ".", runtime % 1000 / 10);
}

std::unique_ptr<Device> make_cuda_device(const CudaDeviceConfig& cfg, std::string_view flag) {
  std::string why;
  const int n = cuda_device_count(&why);
  TIERMOE_CHECK(n > 0, why, std::string(flag),
                "run on a machine with an NVIDIA GPU and its driver (nvidia-smi lists it), or use "
                "--device cpu");
  TIERMOE_CHECK(cfg.ordinal >= 0 && cfg.ordinal < n,
                str_of("there is no GPU cuda:", cfg.ordinal, "; this machine has ", n),
                std::string(flag), str_of("use cuda:0 .. cuda:", n - 1));
  return std::make_unique<cuda::CudaDevice>(cfg);
}

}  // namespace tiermoe
