#pragma once
// cuBLAS, opened when the first CUDA device is made rather than linked:
// libcublasLt is over half a gigabyte, and linking it costs every tiermoe
// process about 1.5 s at start (measured on the build machine), GPU or not.
// Only the calls the expert graphs use, with the header's own signatures.
#include <cublas_v2.h>

namespace tiermoe::cuda {

// cublasGemmBatchedEx with a cublasComputeType_t (the header also declares an
// inline overload taking the older cudaDataType).
using GemmBatchedEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                         int, int, const void*, const void* const[], cudaDataType,
                                         int, const void* const[], cudaDataType, int, const void*,
                                         void* const[], cudaDataType, int, int, cublasComputeType_t,
                                         cublasGemmAlgo_t);

struct CublasLibrary {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSetPointerMode_v2) set_pointer_mode = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  GemmBatchedEx gemm_batched = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;

  // Loads it once per process; Error naming the library and a hint when it
  // cannot be opened.
  static const CublasLibrary& get();
};

// Throws DeviceError naming the call unless it returned CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t s, const char* call, const char* where);

}  // namespace tiermoe::cuda
