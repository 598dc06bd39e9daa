#include "microkernel.h"
#include "tiermoe/core/error.h"

namespace tiermoe::cpu::gemm {

const Microkernel& microkernel(CpuIsa isa, DType in) {
  TIERMOE_ASSERT(in == DType::f32 || in == DType::bf16, "GEMM microkernels take f32 or bf16");
  const int i = in == DType::f32 ? 0 : 1;
  switch (isa) {
    case CpuIsa::avx2:
      return avx2_microkernels()[i];
    case CpuIsa::onednn:
      break;
  }
  throw Error("no TierMoE microkernel for ISA " + std::string(cpu_isa_name(isa)),
              "tiermoe::cpu::gemm", "onednn products run on oneDNN's matmul");
}

}  // namespace tiermoe::cpu::gemm
