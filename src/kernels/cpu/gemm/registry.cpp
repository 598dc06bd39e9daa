#include "microkernel.h"
#include "tiermoe/core/error.h"

namespace tiermoe::cpu::gemm {

// f32 products on avx512bf16 and amx run the avx512 FMA kernel: neither
// instruction has an f32 form, and the FMA chains give the bits of avx2.
const Microkernel& microkernel(CpuIsa isa, DType in) {
  TIERMOE_ASSERT(in == DType::f32 || in == DType::bf16, "GEMM microkernels take f32 or bf16");
  const bool f32 = in == DType::f32;
  switch (isa) {
    case CpuIsa::avx2:
      return avx2_microkernels()[f32 ? 0 : 1];
    case CpuIsa::avx512:
      return avx512_microkernels()[f32 ? 0 : 1];
    case CpuIsa::avx512bf16:
      return f32 ? avx512_microkernels()[0] : avx512bf16_microkernels()[0];
    case CpuIsa::amx:
      return f32 ? avx512_microkernels()[0] : amx_microkernels()[0];
    case CpuIsa::avx512_emu:
    case CpuIsa::avx512bf16_emu:
    case CpuIsa::amx_emu:
      return emulated_microkernels(isa)[f32 ? 0 : 1];
    case CpuIsa::onednn:
      break;
  }
  throw Error("no TierMoE microkernel for ISA " + std::string(cpu_isa_name(isa)),
              "tiermoe::cpu::gemm", "onednn products run on oneDNN's matmul");
}

}  // namespace tiermoe::cpu::gemm
