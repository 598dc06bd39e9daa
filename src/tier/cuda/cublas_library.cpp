#include "cublas_library.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "tiermoe/tier/device.h"

namespace tiermoe::cuda {

namespace {

// The library's own declaration must match the pointer type it is read as
// (unevaluated: no reference to the symbol reaches the linker).
static_assert(sizeof(static_cast<GemmBatchedEx>(&cublasGemmBatchedEx)) > 0);

// The toolkit's copy (its directory, baked in by CMake) first, then the
// loader's search path (LD_LIBRARY_PATH, ld.so.cache).
void* open_cublas(std::string& tried) {
  for (const std::string& path : {std::string(TIERMOE_CUDA_LIBDIR "/" TIERMOE_CUBLAS_SONAME),
                                  std::string(TIERMOE_CUBLAS_SONAME)}) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* e = dlerror();
    tried += detail::str_of("\n  ", path, ": ", e ? e : "not found");
  }
  return nullptr;
}

template <class Fn>
void bind(void* lib, Fn& fn, const char* symbol) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  TIERMOE_CHECK(fn, detail::str_of(TIERMOE_CUBLAS_SONAME " has no symbol ", symbol), "cuBLAS",
                "the cuBLAS found is older than the toolkit this build used; point "
                "LD_LIBRARY_PATH at the toolkit's lib64");
}

CublasLibrary load() {
  std::string tried;
  void* lib = open_cublas(tried);
  TIERMOE_CHECK(lib, "cannot open cuBLAS; tried:" + tried, "cuBLAS",
                "install the CUDA toolkit's cuBLAS (the build used " TIERMOE_CUDA_LIBDIR
                "), or put its directory in LD_LIBRARY_PATH");
  CublasLibrary c;
  bind(lib, c.create, "cublasCreate_v2");
  bind(lib, c.destroy, "cublasDestroy_v2");
  bind(lib, c.set_stream, "cublasSetStream_v2");
  bind(lib, c.set_workspace, "cublasSetWorkspace_v2");
  bind(lib, c.set_pointer_mode, "cublasSetPointerMode_v2");
  bind(lib, c.set_math_mode, "cublasSetMathMode");
  bind(lib, c.gemm_batched, "cublasGemmBatchedEx");
  bind(lib, c.status_string, "cublasGetStatusString");
  return c;  // the library stays open for the process
}

}  // namespace

const CublasLibrary& CublasLibrary::get() {
  static std::once_flag once;
  static CublasLibrary lib;
  std::call_once(once, [] { lib = load(); });
  return lib;
}

void check_cublas(cublasStatus_t s, const char* call, const char* where) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const auto& lib = CublasLibrary::get();
  throw DeviceError(
      detail::str_of(call, " failed: ", lib.status_string(s), " (status ", int(s), ")"), where,
      "cuBLAS refused the call; the status names why");
}

}  // namespace tiermoe::cuda
