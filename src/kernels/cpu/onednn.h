#pragma once
// The oneDNN side of the cpu kernels: one engine, a stream per thread, and a
// GEMM entry point backed by a cache of matmul primitives.
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>

#include "tiermoe/core/dtype.h"

namespace tiermoe::cpu::onednn {

// The process's CPU engine. The first call asks for AMX permission, so any
// oneDNN primitive created through it may use AMX.
dnnl::engine& engine();
// A stream for the calling thread (CPU streams execute in order, inline).
dnnl::stream& stream();

dnnl::memory::data_type to_dnnl(DType dt);

// One matrix product C_MN (+)= A_MK . B_KN, all dense.
//   A is stored row-major [M, K], or with a_transposed as row-major [K, M];
//   B is stored row-major [K, N], or with b_transposed as row-major [N, K];
//   C is row-major [M, N]. A and B have dtype `in`, C has dtype `out`.
// accumulate adds to C (a sum post-op: C = C + A.B, the product rounded to
// `out` once). K == 0 gives C = 0 (or leaves C as is when accumulating).
struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  bool a_transposed = false, b_transposed = false;
  DType in = DType::f32, out = DType::f32;
  bool accumulate = false;
};
void gemm(const GemmShape& shape, const void* a, const void* b, void* c);

// Primitives in the cache (tests and diagnostics).
size_t cached_primitives();

}  // namespace tiermoe::cpu::onednn
