#pragma once
// Plain C++ versions of the AMX instructions kernel_amx.h uses, with the
// interface of ops_amx.h, following the Intel SDM's pseudo-code: each thread
// owns 8 tile registers of 16 rows x 64 bytes and a palette-1 configuration.
// An instruction the hardware would fault on (no configuration, a shape
// LDTILECFG or TDPBF16PS rejects) throws instead, naming the rule.
#include <cstdint>
#include <cstring>
#include <string>

#include "amx_config.h"
#include "emu_float.h"
#include "tiermoe/core/error.h"

namespace tiermoe::cpu::gemm {
namespace {

struct AmxEmu {
  static constexpr int kTiles = 8, kMaxRows = 16, kMaxColsb = 64;

  struct State {
    bool configured = false;
    TileConfig cfg;
    uint8_t tile[kTiles][kMaxRows][kMaxColsb] = {};
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  [[noreturn]] static void fault(const std::string& what) {
    throw Error("emulated AMX: " + what, "tiermoe::cpu::gemm::AmxEmu",
                "the AMX kernel breaks a rule the hardware enforces; fix the kernel");
  }
  static State& configured() {
    State& s = state();
    if (!s.configured) fault("tile instruction without a tile configuration (#UD)");
    return s;
  }

  // LDTILECFG: palette 1 takes rows <= 16 and colsb <= 64 per tile 0-7;
  // reserved bytes and tiles 8-15 zero (else #GP). Zeroes every tile.
  // Palette 0 is the initial state (as TILERELEASE).
  static void load_config(const TileConfig* cfg) {
    if (cfg->palette_id == 0) return release();
    if (cfg->palette_id != 1)
      fault("LDTILECFG palette " + std::to_string(cfg->palette_id) + " (#GP)");
    for (uint8_t r : cfg->reserved) {
      if (r != 0) fault("LDTILECFG reserved bytes must be zero (#GP)");
    }
    for (int t = 0; t < 16; ++t) {
      const bool used = t < kTiles;
      if (cfg->rows[t] > (used ? kMaxRows : 0) || cfg->colsb[t] > (used ? kMaxColsb : 0)) {
        fault("LDTILECFG tile " + std::to_string(t) + " is " + std::to_string(cfg->rows[t]) +
              " rows x " + std::to_string(cfg->colsb[t]) + " bytes (#GP)");
      }
    }
    State& s = state();
    s = State{};
    s.cfg = *cfg;
    s.configured = true;
  }
  // TILERELEASE: back to the initial state.
  static void release() { state() = State{}; }

  // TILELOADD: rows[T] rows of colsb[T] bytes from base + row * stride, the
  // rest of the tile zero.
  template <int T>
  static void load(const void* base, int64_t stride) {
    State& s = configured();
    std::memset(s.tile[T], 0, sizeof s.tile[T]);
    for (int r = 0; r < s.cfg.rows[T]; ++r) {
      std::memcpy(s.tile[T][r], static_cast<const char*>(base) + r * stride, s.cfg.colsb[T]);
    }
  }
  // TILESTORED: rows[T] rows of colsb[T] bytes to base + row * stride.
  template <int T>
  static void store(void* base, int64_t stride) {
    State& s = configured();
    for (int r = 0; r < s.cfg.rows[T]; ++r) {
      std::memcpy(static_cast<char*>(base) + r * stride, s.tile[T][r], s.cfg.colsb[T]);
    }
  }
  // TILEZERO
  template <int T>
  static void zero() {
    std::memset(configured().tile[T], 0, sizeof configured().tile[T]);
  }
  // TDPBF16PS tsrcdest = C, tsrc1 = A, tsrc2 = B (SDM):
  //   for m < C.rows: temp1[0 .. C.colsb/2) = 0
  //     for k < A.colsb/4, n < C.colsb/4 (FMA, DAZ, FTZ, RNE):
  //       temp1[2n+0] += fp32(A[m].bf16[2k+0]) * fp32(B[k].bf16[2n+0])
  //       temp1[2n+1] += fp32(A[m].bf16[2k+1]) * fp32(B[k].bf16[2n+1])
  //     for n (DAZ, FTZ, RNE): C[m].fp32[n] += temp1[2n] + temp1[2n+1]
  // #UD unless the shapes agree (C.colsb == B.colsb, A.rows == C.rows,
  // A.colsb / 4 == B.rows) and the three tiles differ.
  template <int C, int A, int B>
  static void dpbf16() {
    static_assert(C != A && C != B && A != B, "TDPBF16PS needs three distinct tiles (#UD)");
    State& s = configured();
    const TileConfig& g = s.cfg;
    if (g.colsb[C] != g.colsb[B] || g.rows[A] != g.rows[C] || g.colsb[A] / 4 != g.rows[B]) {
      fault("TDPBF16PS shapes disagree (#UD)");
    }
    auto bf16_at = [&](int t, int row, int i) {
      uint16_t v;
      std::memcpy(&v, &s.tile[t][row][2 * i], 2);
      return make_fp32(v);
    };
    for (int m = 0; m < g.rows[C]; ++m) {
      float temp1[kMaxColsb / 2] = {};
      for (int k = 0; k < g.colsb[A] / 4; ++k) {
        for (int n = 0; n < g.colsb[C] / 4; ++n) {
          temp1[2 * n] = fma_daz_ftz(bf16_at(A, m, 2 * k), bf16_at(B, k, 2 * n), temp1[2 * n]);
          temp1[2 * n + 1] =
              fma_daz_ftz(bf16_at(A, m, 2 * k + 1), bf16_at(B, k, 2 * n + 1), temp1[2 * n + 1]);
        }
      }
      for (int n = 0; n < g.colsb[C] / 4; ++n) {
        float c;
        std::memcpy(&c, &s.tile[C][m][4 * n], 4);
        c = add_daz_ftz(c, add_daz_ftz(temp1[2 * n], temp1[2 * n + 1]));
        std::memcpy(&s.tile[C][m][4 * n], &c, 4);
      }
    }
  }
};

}  // namespace
}  // namespace tiermoe::cpu::gemm
