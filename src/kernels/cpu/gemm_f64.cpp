#include "gemm_f64.h"

#include <algorithm>
#include <vector>

#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {
namespace {

// A 4 x 8 register tile: 8 accumulators of 4 doubles, plus two B vectors and
// a broadcast, fits the 16 AVX2 registers of the x86-64-v3 baseline.
constexpr int64_t kTileRows = 4;
constexpr int64_t kTileCols = 8;
// Rows per work item: 32 rows of A (256 KiB at K = 1024) stay in L2 while
// the item sweeps its column panels.
constexpr int64_t kRowsPerItem = 32;

using v4d = double __attribute__((vector_size(32)));

// B repacked as panels of kTileCols columns, each [K][kTileCols] contiguous,
// columns past N zero. The tile loop then reads B with unit stride.
std::vector<double> pack_b(const double* b, int64_t b_row, int64_t b_col, int64_t N, int64_t K) {
  int64_t panels = (N + kTileCols - 1) / kTileCols;
  std::vector<double> packed(size_t(panels * K * kTileCols));
  parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      double* dst = packed.data() + p * K * kTileCols;
      int64_t j0 = p * kTileCols, cols = std::min(kTileCols, N - j0);
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t j = 0; j < kTileCols; ++j) {
          dst[k * kTileCols + j] = j < cols ? b[k * b_row + (j0 + j) * b_col] : 0.0;
        }
      }
    }
  });
  return packed;
}

// One tile: rows i0..i0+3 (rows past M repeat the last row; their results are
// dropped) against one packed panel. acc = 0, then acc = acc + a*b for k in
// order, exactly the ref kernel's sum.
void tile(double* c, int64_t ldc, const double* a, int64_t a_row, int64_t a_col,
          const double* panel, int64_t i0, int64_t j0, int64_t M, int64_t N, int64_t K,
          bool accumulate) {
  const double* a_r[kTileRows];
  for (int64_t r = 0; r < kTileRows; ++r) a_r[r] = a + std::min(i0 + r, M - 1) * a_row;

  v4d acc[kTileRows][2] = {};
  for (int64_t k = 0; k < K; ++k) {
    v4d b_lo, b_hi;
    __builtin_memcpy(&b_lo, panel + k * kTileCols, sizeof(v4d));
    __builtin_memcpy(&b_hi, panel + k * kTileCols + 4, sizeof(v4d));
    for (int64_t r = 0; r < kTileRows; ++r) {
      double av = a_r[r][k * a_col];
      v4d a_v = {av, av, av, av};
      acc[r][0] = acc[r][0] + a_v * b_lo;
      acc[r][1] = acc[r][1] + a_v * b_hi;
    }
  }

  int64_t rows = std::min(kTileRows, M - i0), cols = std::min(kTileCols, N - j0);
  for (int64_t r = 0; r < rows; ++r) {
    double* c_r = c + (i0 + r) * ldc + j0;
    for (int64_t j = 0; j < cols; ++j) {
      double v = acc[r][j / 4][j % 4];
      c_r[j] = accumulate ? c_r[j] + v : v;
    }
  }
}

}  // namespace

void gemm_f64(double* c, const double* a, int64_t a_row, int64_t a_col, const double* b,
              int64_t b_row, int64_t b_col, int64_t M, int64_t N, int64_t K, bool accumulate) {
  if (M == 0 || N == 0) return;
  std::vector<double> packed = pack_b(b, b_row, b_col, N, K);
  int64_t panels = (N + kTileCols - 1) / kTileCols;
  int64_t row_items = (M + kRowsPerItem - 1) / kRowsPerItem;
  // Items run row block by row block, panels inside: a thread's chunk keeps
  // its rows of A hot while it streams the panels. Items never split K.
  parallel_for(row_items * panels, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t row_item = t / panels, p = t % panels;
      const double* panel = packed.data() + p * K * kTileCols;
      int64_t i_end = std::min(M, (row_item + 1) * kRowsPerItem);
      for (int64_t i0 = row_item * kRowsPerItem; i0 < i_end; i0 += kTileRows) {
        tile(c, N, a, a_row, a_col, panel, i0, p * kTileCols, M, N, K, accumulate);
      }
    }
  });
}

}  // namespace tiermoe::cpu
