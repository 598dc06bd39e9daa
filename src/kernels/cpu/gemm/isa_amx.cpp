// The amx microkernel for bf16 inputs: 32 x 32 blocks of C in tiles (f32
// inputs use the avx512 kernel). Compiled with -mamx-tile -mamx-bf16
// (CMakeLists.txt); only the table leaves this file.
#include "kernel_amx.h"
#include "microkernel.h"
#include "peak_loops.h"
#include "ops_amx.h"

namespace tiermoe::cpu::gemm {
namespace {

constexpr Microkernel kTable[] = {
    {.isa = CpuIsa::amx,
     .in = DType::bf16,
     .mr = 32,
     .nr = 32,
     .mc = 256,
     .k_step = 32,
     .a = APack::bf16_tiles,
     .b = BPack::bf16_pairs,
     .run = amx_kernel<Amx>,
     .thread_begin = amx_begin<Amx>,
     .thread_end = amx_end<Amx>,
     .peak = amx_peak<Amx>},
};

}  // namespace

const Microkernel* amx_microkernels() { return kTable; }

}  // namespace tiermoe::cpu::gemm
