#pragma once
// Plain C++ versions of the AVX-512 instructions the kernels use, one
// function per instruction following its SDM pseudo-code, with the
// interfaces of ops_avx512.h and ops_avx512bf16.h. isa_emu.cpp builds the
// very kernel templates against them, so the kernels run (slowly) on any
// machine. MXCSR is taken at its default (round to nearest even, no DAZ or
// FTZ), as TierMoE never changes it; VDPBF16PS ignores MXCSR.
#include <cstdint>
#include <cstring>

#include "emu_float.h"

namespace tiermoe::cpu::gemm {
namespace {

struct Avx512Emu {
  static constexpr int kLanes = 16;
  struct F {
    float v[kLanes];
  };
  struct I {
    uint32_t v[kLanes];
  };
  // VXORPS
  static F zero() { return F{}; }
  // VMOVUPS load / store
  static F load(const float* p) {
    F r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static void store(float* p, const F& x) { std::memcpy(p, x.v, sizeof x.v); }
  // VBROADCASTSS zmm, m32
  static F broadcast(const float* p) {
    F r;
    for (float& x : r.v) x = *p;
    return r;
  }
  // VFMADD231PS: a * b + c, rounded once
  static F fma(const F& a, const F& b, const F& c) {
    F r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = std::fma(a.v[i], b.v[i], c.v[i]);
    return r;
  }
  // VMOVDQU32 load
  static I load_u32(const uint32_t* p) {
    I r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  // VPSLLD w, 16 (as f32)
  static F bf16_lo(const I& w) {
    F r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = std::bit_cast<float>(w.v[i] << 16);
    return r;
  }
  // VPANDD w, 0xffff0000 (as f32)
  static F bf16_hi(const I& w) {
    F r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = std::bit_cast<float>(w.v[i] & 0xffff0000u);
    return r;
  }
};

struct Avx512Bf16Emu : Avx512Emu {
  // VPBROADCASTD zmm, m32
  static I broadcast_u32(const uint32_t* p) {
    I r;
    for (uint32_t& x : r.v) x = *p;
    return r;
  }
  // VDPBF16PS srcdest, src1, src2, per dword i (SDM):
  //   srcdest.fp32[i] += make_fp32(src1.bf16[2i+1]) * make_fp32(src2.bf16[2i+1])
  //   srcdest.fp32[i] += make_fp32(src1.bf16[2i+0]) * make_fp32(src2.bf16[2i+0])
  // each an FMA with DAZ, FTZ and round to nearest even.
  static F dpbf16(const F& acc, const I& a, const I& b) {
    F r;
    for (int i = 0; i < kLanes; ++i) {
      float s = fma_daz_ftz(make_fp32(uint16_t(a.v[i] >> 16)), make_fp32(uint16_t(b.v[i] >> 16)),
                            acc.v[i]);
      r.v[i] = fma_daz_ftz(make_fp32(uint16_t(a.v[i])), make_fp32(uint16_t(b.v[i])), s);
    }
    return r;
  }
};

}  // namespace
}  // namespace tiermoe::cpu::gemm
