// The avx512bf16 microkernel for bf16 inputs: 12 rows x 32 columns of
// vdpbf16ps (f32 inputs use the avx512 kernel). Compiled with -mavx512f
// -mavx512bf16 (CMakeLists.txt); only the table leaves this file.
#include "kernel_dpbf16.h"
#include "microkernel.h"
#include "peak_loops.h"
#include "ops_avx512bf16.h"

namespace tiermoe::cpu::gemm {
namespace {

constexpr int kMr = 12, kNv = 2;

constexpr Microkernel kTable[] = {
    {.isa = CpuIsa::avx512bf16,
     .in = DType::bf16,
     .mr = kMr,
     .nr = kNv * Avx512Bf16::kLanes,
     .k_step = 2,
     .a = APack::bf16_pairs,
     .b = BPack::bf16_pairs,
     .run = dpbf16_kernel<Avx512Bf16, kMr, kNv>,
     .peak = dpbf16_peak<Avx512Bf16>},
};

}  // namespace

const Microkernel* avx512bf16_microkernels() { return kTable; }

}  // namespace tiermoe::cpu::gemm
