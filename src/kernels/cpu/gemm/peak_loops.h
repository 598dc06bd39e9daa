#pragma once
// Register-only loops of each ISA's multiply-add instruction, for the peak a
// benchmark sets its kernels' TFLOP/s against: independent accumulators
// (more than the instruction's latency times its ports), operands never
// reloaded, the sums stored once at the end so nothing is dead. Each returns
// the flops it did. Templates over the ISA wrappers (see microkernel.h on the
// real-ISA translation units).
//
// Each chain starts from its own value. When they started from two (FMA) or
// one (VDPBF16PS) distinct values, GCC 12 saw that equal chains stay equal
// and ran 2 (1) of the 12 while the loop counted 12: the AVX2 "peak" came out
// 1.5x the real one. The disassembly of each *_peak must show 12 multiply-adds
// in its loop.
#include <cstdint>

#include "amx_config.h"
#include "unroll.h"

namespace tiermoe::cpu::gemm {

constexpr int kPeakChains = 12;

// kPeakChains + 16 distinct floats near 1: chain i starts at init + i.
inline void peak_init(float* init) {
  for (int i = 0; i < kPeakChains + 16; ++i) init[i] = 1.f + float(i) * 1e-3f;
}

// FMA: 2 flops per lane.
template <class V>
int64_t fma_peak(int64_t reps) {
  alignas(64) float init[kPeakChains + 16];
  peak_init(init);
  typename V::F acc[kPeakChains];
  // a * acc + b with a just under 1 stays finite and normal for any reps.
  alignas(64) float ab[32];
  for (int i = 0; i < 32; ++i) ab[i] = i < 16 ? 0.999f : 1e-3f;
  const typename V::F a = V::load(ab), b = V::load(ab + 16);
  unroll<kPeakChains>([&](auto i) { acc[i] = V::load(init + i); });
  for (int64_t r = 0; r < reps; ++r) {
    unroll<kPeakChains>([&](auto i) { acc[i] = V::fma(acc[i], a, b); });
  }
  alignas(64) float out[16];
  float total = 0;
  unroll<kPeakChains>([&](auto i) {
    V::store(out, acc[i]);
    total += out[0];
  });
  volatile float sink = total;
  (void)sink;
  return reps * kPeakChains * V::kLanes * 2;
}

// VDPBF16PS: two products and two adds per lane.
template <class V>
int64_t dpbf16_peak(int64_t reps) {
  alignas(64) uint32_t init[32];
  for (int i = 0; i < 32; ++i) init[i] = 0x3f803f80u + uint32_t(i);  // bf16 pairs near 1
  alignas(64) float start[kPeakChains + 16];
  peak_init(start);
  typename V::F acc[kPeakChains];
  const typename V::I a = V::load_u32(init), b = V::load_u32(init + 16);
  unroll<kPeakChains>([&](auto i) { acc[i] = V::load(start + i); });
  for (int64_t r = 0; r < reps; ++r) {
    unroll<kPeakChains>([&](auto i) { acc[i] = V::dpbf16(acc[i], a, b); });
  }
  alignas(64) float out[16];
  float total = 0;
  unroll<kPeakChains>([&](auto i) {
    V::store(out, acc[i]);
    total += out[0];
  });
  volatile float sink = total;
  (void)sink;
  return reps * kPeakChains * V::kLanes * 4;
}

// TDPBF16PS on four C tiles from two A and two B tiles loaded once:
// 16 x 16 x 32 products and adds per instruction.
template <class T>
int64_t amx_peak(int64_t reps) {
  TileConfig cfg;
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  alignas(64) static thread_local uint16_t tile[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) tile[i] = 0x3f80;  // bf16 1.0
  alignas(64) static thread_local float c[16 * 16];
  T::load_config(&cfg);
  T::template zero<0>();
  T::template zero<1>();
  T::template zero<2>();
  T::template zero<3>();
  T::template load<4>(tile, 64);
  T::template load<5>(tile, 64);
  T::template load<6>(tile, 64);
  T::template load<7>(tile, 64);
  for (int64_t r = 0; r < reps; ++r) {
    T::template dpbf16<0, 4, 6>();
    T::template dpbf16<1, 4, 7>();
    T::template dpbf16<2, 5, 6>();
    T::template dpbf16<3, 5, 7>();
  }
  T::template store<0>(c, 64);
  T::template store<1>(c, 64);
  T::template store<2>(c, 64);
  T::template store<3>(c, 64);
  T::release();
  return reps * 4 * 16 * 16 * 32 * 2;
}

}  // namespace tiermoe::cpu::gemm
