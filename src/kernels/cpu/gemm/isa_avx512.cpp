// The avx512 microkernels: 12 rows x 32 columns (24 accumulators of 16
// floats, two B vectors and a broadcast in the 32 zmm registers). Compiled
// with -mavx512f (CMakeLists.txt): everything here is internal to this file
// but the table, so no code built for AVX-512 can be picked by the linker
// for another caller (microkernel.h).
// GCC 12 warns inside its own _mm512_slli_epi32, whose _mm512_undefined_epi32
// is self-initialised on purpose (an undefined value is what it means).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernel_fma.h"
#include "microkernel.h"
#include "peak_loops.h"
#include "ops_avx512.h"

namespace tiermoe::cpu::gemm {
namespace {

constexpr int kMr = 12, kNv = 2;

constexpr Microkernel kTable[] = {
    {.isa = CpuIsa::avx512,
     .in = DType::f32,
     .mr = kMr,
     .nr = kNv * Avx512::kLanes,
     .k_step = 1,
     .a = APack::f32_kmajor,
     .b = BPack::f32,
     .run = fma_f32<Avx512, kMr, kNv>,
     .peak = fma_peak<Avx512>},
    {.isa = CpuIsa::avx512,
     .in = DType::bf16,
     .mr = kMr,
     .nr = kNv * Avx512::kLanes,
     .k_step = 1,
     .a = APack::f32_kmajor,
     .b = BPack::bf16_split,
     .run = fma_bf16<Avx512, kMr, kNv>,
     .peak = fma_peak<Avx512>},
};

}  // namespace

const Microkernel* avx512_microkernels() { return kTable; }

}  // namespace tiermoe::cpu::gemm
