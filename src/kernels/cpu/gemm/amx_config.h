#pragma once
// The 64-byte operand of LDTILECFG (palette 1), as the Intel SDM lays it out.
#include <cstdint>

namespace tiermoe::cpu::gemm {

struct alignas(64) TileConfig {
  uint8_t palette_id = 0;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile t (tiles 8-15 must stay 0)
  uint8_t rows[16] = {};    // rows of tile t
};
static_assert(sizeof(TileConfig) == 64);

}  // namespace tiermoe::cpu::gemm
