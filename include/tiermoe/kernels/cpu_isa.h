#pragma once
// The instruction set the cpu:: GEMM kernels run on (kernels/cpu/gemm/).
//
// Chosen once per process, never per shape: TIERMOE_ISA when set, otherwise
// the best the CPU has (amx > avx512bf16 > avx512 > avx2). Every row of a
// product is then computed by one instruction sequence whatever the row count
// (docs/architecture.md, parity rules). f32 products run the same FMA chains
// on avx2, avx512, avx512bf16 and amx, so they give the same bits on all
// four; bf16 products
// differ between avx2/avx512 (bf16 widened to f32, one FMA per product),
// avx512bf16 (vdpbf16ps pairs) and amx (tdpbf16ps tiles).
//
// The *_emu ISAs build the very kernel source of avx512, avx512bf16 and amx
// a second time against plain C++ versions of each instruction (the Intel
// SDM's pseudo-code), so the kernels' blocking, packing and epilogues are
// tested on any x86-64-v3 machine. They are slow: tests only.
//
// onednn is the previous path, oneDNN 2.6's matmul, kept as a benchmark
// baseline. It is NOT row-count invariant (oneDNN picks kernels per shape),
// and has no bf16 matmul without AVX-512.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tiermoe {

enum class CpuIsa : uint8_t {
  avx2,
  avx512,
  avx512bf16,
  amx,
  avx512_emu,
  avx512bf16_emu,
  amx_emu,
  onednn,
};

// "avx2", "avx512", "avx512bf16", "amx", "avx512-emu", "avx512bf16-emu",
// "amx-emu", "onednn".
std::string_view cpu_isa_name(CpuIsa isa);
// The inverse of cpu_isa_name; Error listing the names otherwise.
CpuIsa parse_cpu_isa(std::string_view name, std::string_view where = "TIERMOE_ISA");
bool cpu_isa_emulated(CpuIsa isa);
// The hardware ISA an emulated one stands for (itself for the others).
CpuIsa cpu_isa_real(CpuIsa isa);
// Whether this machine can run it: CPUID and the OS's register state (and for
// amx the tile-data permission) for the hardware ones; always for the rest.
bool cpu_isa_supported(CpuIsa isa);
// Why not, in words, for an unsupported one ("this CPU has no AVX-512 ...").
std::string cpu_isa_missing(CpuIsa isa);
// Every GEMM ISA this machine can run: the hardware ones, best last, then the
// emulated ones (onednn is not listed).
std::vector<CpuIsa> cpu_isas_supported();

// The process's ISA. The first call decides it (TIERMOE_ISA, else the best
// supported) and throws Error when TIERMOE_ISA names one this machine lacks.
CpuIsa cpu_isa();
// Sets the process's ISA (tests, `bench --isa`). Error when unsupported. Not
// while kernels run: every GEMM reads it once at its start.
void set_cpu_isa(CpuIsa isa);

}  // namespace tiermoe
