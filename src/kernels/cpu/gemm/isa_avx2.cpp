// The avx2 microkernels: 6 rows x 16 columns (12 accumulators of 8 floats,
// two B vectors and one broadcast: 15 of the 16 ymm registers).
#include "kernel_fma.h"
#include "microkernel.h"
#include "peak_loops.h"
#include "ops_avx2.h"

namespace tiermoe::cpu::gemm {
namespace {

constexpr int kMr = 6, kNv = 2;

constexpr Microkernel kTable[] = {
    {.isa = CpuIsa::avx2,
     .in = DType::f32,
     .mr = kMr,
     .nr = kNv * Avx2::kLanes,
     .k_step = 1,
     .a = APack::f32_kmajor,
     .b = BPack::f32,
     .run = fma_f32<Avx2, kMr, kNv>,
     .peak = fma_peak<Avx2>},
    {.isa = CpuIsa::avx2,
     .in = DType::bf16,
     .mr = kMr,
     .nr = kNv * Avx2::kLanes,
     .k_step = 1,
     .a = APack::f32_kmajor,
     .b = BPack::bf16_split,
     .run = fma_bf16<Avx2, kMr, kNv>,
     .peak = fma_peak<Avx2>},
};

}  // namespace

const Microkernel* avx2_microkernels() { return kTable; }

}  // namespace tiermoe::cpu::gemm
