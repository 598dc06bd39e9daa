#pragma once
// The f32 arithmetic of the bf16 dot-product instructions as the Intel SDM
// defines it (VDPBF16PS, TDPBF16PS): bf16 operands are the upper half of an
// f32; every step rounds to nearest even, treats denormal inputs as zero
// (DAZ) and flushes denormal results to zero (FTZ), whatever MXCSR says.
// Plain C++ for the emulated ISAs (isa_emu.cpp only).
#include <bit>
#include <cmath>
#include <cstdint>

namespace tiermoe::cpu::gemm {
namespace {

// make_fp32(x): the bf16 bits in the upper 16 bits of a dword.
inline float make_fp32(uint16_t x) { return std::bit_cast<float>(uint32_t(x) << 16); }

inline float zero_denormal(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

// a * b + c rounded once (RNE), DAZ in, FTZ out.
inline float fma_daz_ftz(float a, float b, float c) {
  return zero_denormal(std::fma(zero_denormal(a), zero_denormal(b), zero_denormal(c)));
}

// a + b rounded (RNE), DAZ in, FTZ out.
inline float add_daz_ftz(float a, float b) {
  return zero_denormal(zero_denormal(a) + zero_denormal(b));
}

}  // namespace
}  // namespace tiermoe::cpu::gemm
