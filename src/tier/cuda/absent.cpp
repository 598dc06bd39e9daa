// The CUDA backend's entry points in a build without it (CMake did not find
// the CUDA toolkit, or TIERMOE_CUDA=OFF): every caller gets the same clear
// answer instead of an #if.
#include "tiermoe/core/error.h"
#include "tiermoe/tier/cuda_device.h"

namespace tiermoe {

namespace {

constexpr const char* kAbsent =
    "this build has no CUDA backend (CMake found no CUDA toolkit, or TIERMOE_CUDA=OFF)";
constexpr const char* kHint =
    "install the CUDA toolkit and rebuild (make build CMAKE_ARGS=-DTIERMOE_CUDA=ON), or use "
    "--device cpu";

}  // namespace

bool cuda_backend_built() { return false; }

int cuda_device_count(std::string* why) {
  if (why) *why = kAbsent;
  return 0;
}

std::string cuda_device_summary(int) { throw Error(kAbsent, "CUDA", kHint); }

std::unique_ptr<Device> make_cuda_device(const CudaDeviceConfig&, std::string_view flag) {
  throw Error(kAbsent, std::string(flag), kHint);
}

}  // namespace tiermoe
