// The emulated ISAs: the kernel templates of avx512, avx512bf16 and amx built
// against plain C++ instructions (ops_avx512_emu.h, ops_amx_emu.h) with the
// same blocking, so their packing, masking and epilogues are tested on any
// machine. Only the hardware instructions themselves are not exercised.
#include "kernel_amx.h"
#include "kernel_dpbf16.h"
#include "kernel_fma.h"
#include "microkernel.h"
#include "ops_amx_emu.h"
#include "ops_avx512_emu.h"
#include "tiermoe/core/error.h"

namespace tiermoe::cpu::gemm {
namespace {

constexpr int kMr = 12, kNv = 2, kNr = kNv * Avx512Emu::kLanes;

constexpr Microkernel kFmaF32 = {.isa = CpuIsa::avx512_emu,
                                 .in = DType::f32,
                                 .mr = kMr,
                                 .nr = kNr,
                                 .k_step = 1,
                                 .a = APack::f32_kmajor,
                                 .b = BPack::f32,
                                 .run = fma_f32<Avx512Emu, kMr, kNv>};

constexpr Microkernel kAvx512[] = {
    kFmaF32,
    {.isa = CpuIsa::avx512_emu,
     .in = DType::bf16,
     .mr = kMr,
     .nr = kNr,
     .k_step = 1,
     .a = APack::f32_kmajor,
     .b = BPack::bf16_split,
     .run = fma_bf16<Avx512Emu, kMr, kNv>},
};

constexpr Microkernel kAvx512Bf16[] = {
    kFmaF32,
    {.isa = CpuIsa::avx512bf16_emu,
     .in = DType::bf16,
     .mr = kMr,
     .nr = kNr,
     .k_step = 2,
     .a = APack::bf16_pairs,
     .b = BPack::bf16_pairs,
     .run = dpbf16_kernel<Avx512Bf16Emu, kMr, kNv>},
};

constexpr Microkernel kAmx[] = {
    kFmaF32,
    {.isa = CpuIsa::amx_emu,
     .in = DType::bf16,
     .mr = 32,
     .nr = 32,
     .mc = 256,
     .k_step = 32,
     .a = APack::bf16_tiles,
     .b = BPack::bf16_pairs,
     .run = amx_kernel<AmxEmu>,
     .thread_begin = amx_begin<AmxEmu>,
     .thread_end = amx_end<AmxEmu>},
};

}  // namespace

const Microkernel* emulated_microkernels(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::avx512_emu:
      return kAvx512;
    case CpuIsa::avx512bf16_emu:
      return kAvx512Bf16;
    case CpuIsa::amx_emu:
      return kAmx;
    default:
      break;
  }
  TIERMOE_ASSERT(false, "not an emulated ISA: ", cpu_isa_name(isa));
  return nullptr;
}

}  // namespace tiermoe::cpu::gemm
