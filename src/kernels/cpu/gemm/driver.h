#pragma once
// The blocked GEMM driver: C = A . B in f32 sums, cut into blocks of C that
// threads share out, each block's K run in fixed kc steps through one ISA's
// microkernel, then handed to an epilogue (a store, or an expert's fused
// activation). Threads split over blocks of rows and columns, never over K.
#include <cstdint>

#include "microkernel.h"
#include "pack.h"

namespace tiermoe::cpu::gemm {

// B's panels made by the caller, on the fly (weights stored quantized):
// pack(ctx, j0, cols, k0, kc, dst) returns the panel pack_b(uk, b, j0, cols,
// k0, kc, K, dst) would write for the B it stands for: written into dst, or
// in a buffer of the source's own that stays valid until its next call on
// this thread.
struct BSource {
  const void* (*pack)(const void* ctx, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
                      void* dst) = nullptr;
  const void* ctx = nullptr;
};

// C_MN = A_MK . B_KN. B comes as stored (packed per block on the fly), from
// a BSource (the same, by the caller), or prepacked: all of it in uk's
// layout by pack_b_all() (`b_packed`).
struct Problem {
  int64_t M = 0, N = 0, K = 0;
  Mat a, b;
  const void* b_packed = nullptr;
  const BSource* b_source = nullptr;
};

// Receives each block of C once, finished: rows [i0, i0 + rows), columns
// [j0, j0 + cols), the f32 sums at acc[i * ld + j]. Blocks of one call may
// run on different threads at once.
struct Epilogue {
  void (*fn)(const void* ctx, int64_t i0, int64_t j0, int64_t rows, int64_t cols, const float* acc,
             int64_t ld) = nullptr;
  const void* ctx = nullptr;
};

// The plain store: c (row-major, dtype out) = sum, or c + sum with
// accumulate (the sum rounded once to out, as ref does).
struct StoreC {
  void* c = nullptr;
  int64_t ldc = 0;
  DType out = DType::f32;
  bool accumulate = false;
};
Epilogue store_epilogue(const StoreC& s);

void run(const Microkernel& uk, const Problem& p, const Epilogue& ep);

// Rows [i0, i0 + rows) x columns [j0, j0 + cols) of C on this thread, with
// rows <= tall_rows(uk) and j0 a multiple of block_cols(uk): each block of
// block_cols(uk) columns handed to ep when finished, A packed once for all
// of them (while its panels over K fit kKeepACap). run() is a parallel loop
// over these; grouped products (kernels/grouped_matmul.h) schedule their
// own. The calling thread must be between uk.thread_begin and uk.thread_end.
void run_block(const Microkernel& uk, const Problem& p, const Epilogue& ep, int64_t i0,
               int64_t rows, int64_t j0, int64_t cols);
// How many columns (a multiple of block_cols(uk)) one task of a product
// with N columns and `row_blocks` blocks of rows should take, so that
// `threads` threads get about `tasks_per_thread` tasks each: all of N when
// the rows alone give that many.
int64_t column_chunk(const Microkernel& uk, int64_t N, int64_t row_blocks, int threads,
                     int tasks_per_thread = 4);

// How many times any thread's GEMM scratch has grown (an allocation), so tests
// can hold that warmed-up launches allocate nothing.
int64_t scratch_growths();

// The fixed blocking (constants, so nothing depends on M): blocks of C are
// mc x nc, K runs in kc steps.
int64_t block_rows(const Microkernel& uk);  // mc, a multiple of mr
int64_t block_cols(const Microkernel& uk);  // nc, a multiple of nr
// The rows one task takes when B is too large to pack once for all of them
// (a multiple of mc): its f32 sums, tall_rows x nc, stay about 1 MB (L2).
int64_t tall_rows(const Microkernel& uk);
constexpr int64_t kKc = 256;                // a multiple of every k_step
constexpr int64_t kKeepACap = int64_t(8) << 20;  // bytes of one block's packed A kept
constexpr int64_t kAccCap = int64_t(4) << 20;    // bytes of f32 sums one task keeps in flight
// Blocks of at most this many A panels over a prepacked B run each block of
// C through all of K in one microkernel call (memory-bound: few rows); taller
// ones step K by kc so that a B panel stays in L1 for all their A panels.
constexpr int64_t kWholeKPanels = 2;

// B (K x N) prepacked for uk: ceil(N / nr) panels over round_up(K, k_step),
// each b_panel_bytes(uk, Kp) at panel * that.
int64_t packed_b_bytes(const Microkernel& uk, int64_t K, int64_t N);
void pack_b_all(const Microkernel& uk, const Mat& b, int64_t K, int64_t N, void* dst);

}  // namespace tiermoe::cpu::gemm
