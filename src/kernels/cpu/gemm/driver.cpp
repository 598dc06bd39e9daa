#include "driver.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu::gemm {
namespace {

std::atomic<int64_t> g_growths{0};

// A thread's packing and accumulation buffers. Each is sized for a whole
// block of the microkernel that asks and only grows, so after a thread's
// first product of each dtype no call allocates.
class Buffer {
 public:
  ~Buffer() { std::free(ptr_); }
  void* get(int64_t bytes) {
    if (bytes > size_) {
      std::free(ptr_);
      size_ = round_up(bytes, 4096);
      ptr_ = std::aligned_alloc(64, size_t(size_));
      if (!ptr_) throw std::bad_alloc();
      g_growths.fetch_add(1, std::memory_order_relaxed);
    }
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  int64_t size_ = 0;
};

struct Scratch {
  Buffer a, b, acc;
  Buffer shared_b;  // all of B, packed by the calling thread for its workers
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// PREFETCHT1 of up to `lines` cache lines from `from`, none at or past `end`.
void prefetch_l2(const char* from, const char* end, int64_t lines) {
  for (int64_t l = 0; l < lines && from + l * 64 < end; ++l)
    __builtin_prefetch(from + l * 64, 0, 2);
}

// A block of at most kWholeKPanels A panels (few rows: a memory-bound
// product) over a prepacked B: each mr x nr block of C goes through all of K
// in one microkernel call, its sums held in the tiles (or registers)
// throughout. The kc-stepped loop would store and reload them every kc, and
// with AMX each store waits for the chain of products before it to drain
// (measured: a quarter of the kernel's time at 64 rows per expert). A
// prepacked B panel over K is one run (its kc blocks concatenate into the
// layout over their sum, for every microkernel), and so is each A panel
// packed here; the bits are those of the kc steps, which store and reload
// the f32 sums exactly.
// a_pack holds the block's A panels over K, acc its sums (rows x nc).
void run_whole_k(const Microkernel& uk, const Problem& p, const Epilogue& ep, int64_t i0,
                 int64_t rows, int64_t j0, int64_t cols, char* a_pack, float* acc) {
  const int64_t mr = uk.mr, nr = uk.nr, nc = block_cols(uk);
  const int64_t Kp = round_up(p.K, uk.k_step), m_panels = ceil_div(rows, mr);
  const int64_t a_full = a_panel_bytes(uk, Kp), b_full = b_panel_bytes(uk, Kp);
  for (int64_t ip = 0; ip < m_panels; ++ip) {
    for (int64_t k0 = 0; k0 < Kp; k0 += kKc) {
      pack_a(uk, p.a, i0 + ip * mr, std::min(mr, rows - ip * mr), k0, std::min(kKc, Kp - k0), p.K,
             a_pack + ip * a_full + a_panel_bytes(uk, k0));
    }
  }
  const char* b = static_cast<const char*>(p.b_packed);
  // Each call prefetches its share of the next B panel into L2, as
  // run_block does (the weight streams from memory).
  const int64_t share = ceil_div(b_full / 64, m_panels);
  for (int64_t jb = j0; jb < j0 + cols; jb += nc) {
    const int64_t bcols = std::min(nc, j0 + cols - jb);
    for (int64_t j = jb; j < jb + bcols; j += nr) {
      const char* b_panel = b + j / nr * b_full;
      const char* b_next = j + nr < j0 + cols ? b_panel + b_full : nullptr;
      for (int64_t ip = 0; ip < m_panels; ++ip) {
        if (b_next) prefetch_l2(b_next + ip * share * 64, b_next + b_full, share);
        uk.run(Kp, a_pack + ip * a_full, b_panel, acc + ip * mr * nc + (j - jb), nc, false);
      }
    }
    ep.fn(ep.ctx, i0, jb, rows, bcols, acc, nc);
  }
}

}  // namespace

void run_block(const Microkernel& uk, const Problem& p, const Epilogue& ep, int64_t i0,
               int64_t rows, int64_t j0, int64_t cols) {
  const int64_t mr = uk.mr, nr = uk.nr, nc = block_cols(uk);
  const int64_t Kp = round_up(p.K, uk.k_step);
  const int64_t m_panels = ceil_div(rows, mr);
  // Buffers for a whole block (or the tall block that asked), so they grow
  // once per thread and dtype.
  const int64_t buffer_rows = std::max(block_rows(uk), round_up(rows, mr));
  const int64_t a_bytes = a_panel_bytes(uk, kKc), b_bytes = b_panel_bytes(uk, kKc);
  // The rows' A panels for every kc step, kept across the column blocks so
  // A is packed once per call, not once per block of nc columns (up to a
  // cap). Past it (a long K: the LM head's dx) the column blocks go through
  // K together, a group of them at a time with all their sums in flight (up
  // to kAccCap bytes), so each step of A is packed once per group.
  const int64_t a_step_bytes = buffer_rows / mr * a_bytes;
  const int64_t k_steps = ceil_div(Kp, kKc);
  const bool a_fits = k_steps * a_step_bytes <= kKeepACap;
  const bool keep_a = cols > nc && a_fits;
  const int64_t acc_floats = buffer_rows * nc;  // one column block's sums
  const int64_t group =
      keep_a ? 1 : std::clamp<int64_t>(kAccCap / (4 * acc_floats), 1, ceil_div(cols, nc));
  // Both loops take buffers of these sizes, so a thread's scratch grows once
  // per block shape, whichever loop its blocks take.
  Scratch& s = scratch();
  float* acc = static_cast<float*>(s.acc.get(group * acc_floats * 4));
  char* a_pack = static_cast<char*>(s.a.get((a_fits ? k_steps : 1) * a_step_bytes));
  if (p.b_packed && Kp > 0 && m_panels <= kWholeKPanels && a_fits) {
    run_whole_k(uk, p, ep, i0, rows, j0, cols, a_pack, acc);
    return;
  }
  if (Kp == 0) std::memset(acc, 0, size_t(group * acc_floats * 4));
  char* b_pack = p.b_packed ? nullptr : static_cast<char*>(s.b.get(nc / nr * b_bytes));
  const int64_t b_full = b_panel_bytes(uk, Kp);
  auto prepacked_panel = [&](int64_t j, int64_t k0) {
    return static_cast<const char*>(p.b_packed) + (j / nr) * b_full + b_panel_bytes(uk, k0);
  };
  for (int64_t jg = j0; jg < j0 + cols; jg += group * nc) {
    const int64_t gcols = std::min(group * nc, j0 + cols - jg);
    for (int64_t k0 = 0; k0 < Kp; k0 += kKc) {
      const int64_t kc = std::min(kKc, Kp - k0);
      char* a_step = a_pack + (keep_a ? k0 / kKc * a_step_bytes : 0);
      if (!keep_a || jg == j0) {
        for (int64_t ip = 0; ip < m_panels; ++ip) {
          pack_a(uk, p.a, i0 + ip * mr, std::min(mr, rows - ip * mr), k0, kc, p.K,
                 a_step + ip * a_bytes);
        }
      }
      for (int64_t jb = jg; jb < jg + gcols; jb += nc) {
        const int64_t bcols = std::min(nc, jg + gcols - jb), n_panels = ceil_div(bcols, nr);
        float* acc_b = acc + (jb - jg) / nc * acc_floats;
        for (int64_t jp = 0; jp < n_panels; ++jp) {
          const int64_t j = jb + jp * nr;
          const void* b_panel;
          const char* b_next = nullptr;
          if (p.b_packed) {
            b_panel = prepacked_panel(j, k0);
            // The panel after this one in the loop order: the next columns
            // of the group at this k step, else the group's first at the next.
            if (j + nr < jg + gcols) {
              b_next = prepacked_panel(j + nr, k0);
            } else if (k0 + kKc < Kp) {
              b_next = prepacked_panel(jg, k0 + kKc);
            }
          } else {
            const int64_t n = std::min(nr, jb + bcols - j);
            if (p.b_source) {
              b_panel = p.b_source->pack(p.b_source->ctx, j, n, k0, kc, b_pack + jp * b_bytes);
            } else {
              pack_b(uk, p.b, j, n, k0, kc, p.K, b_pack + jp * b_bytes);
              b_panel = b_pack + jp * b_bytes;
            }
          }
          // The B panel stays in L1 while the block's A panels stream past
          // it. A prepacked B (a weight) comes from memory, each panel of it
          // once per block of rows, and the hardware prefetchers do not run
          // ahead of tile and vector loads that jump from panel to panel, so
          // each A panel's call prefetches its share of the next B panel
          // into L2 (measured: W2 at 1,024 rows per expert, 25% -> 31% of
          // the AMX peak, 65% -> 74% of the AVX-512 one).
          const int64_t share = ceil_div(b_bytes / 64, m_panels);
          for (int64_t ip = 0; ip < m_panels; ++ip) {
            if (b_next) prefetch_l2(b_next + ip * share * 64, b_next + b_bytes, share);
            uk.run(kc, a_step + ip * a_bytes, b_panel, acc_b + ip * mr * nc + jp * nr, nc, k0 > 0);
          }
        }
      }
    }
    for (int64_t jb = jg; jb < jg + gcols; jb += nc) {
      ep.fn(ep.ctx, i0, jb, rows, std::min(nc, jg + gcols - jb), acc + (jb - jg) / nc * acc_floats,
            nc);
    }
  }
}

int64_t column_chunk(const Microkernel& uk, int64_t N, int64_t row_blocks, int threads,
                     int tasks_per_thread) {
  const int64_t nc = block_cols(uk), n_blocks = ceil_div(N, nc);
  // Enough tasks for every thread to get about tasks_per_thread, else whole
  // rows.
  const int64_t want = int64_t(tasks_per_thread) * int64_t(threads);
  const int64_t chunks =
      std::clamp<int64_t>(ceil_div(want, std::max<int64_t>(1, row_blocks)), 1, n_blocks);
  return ceil_div(n_blocks, chunks) * nc;
}

namespace {

void store_block(const void* ctx, int64_t i0, int64_t j0, int64_t rows, int64_t cols,
                 const float* acc, int64_t ld) {
  const StoreC& s = *static_cast<const StoreC*>(ctx);
  for (int64_t i = 0; i < rows; ++i) {
    const float* a = acc + i * ld;
    if (s.out == DType::f32) {
      float* c = static_cast<float*>(s.c) + (i0 + i) * s.ldc + j0;
      if (s.accumulate) {
        for (int64_t j = 0; j < cols; ++j) c[j] = c[j] + a[j];
      } else {
        std::memcpy(c, a, size_t(cols) * 4);
      }
    } else {
      bf16* c = static_cast<bf16*>(s.c) + (i0 + i) * s.ldc + j0;
      if (s.accumulate) {
        for (int64_t j = 0; j < cols; ++j) c[j] = float_to_bf16(bf16_to_float(c[j]) + a[j]);
      } else {
        for (int64_t j = 0; j < cols; ++j) c[j] = float_to_bf16(a[j]);
      }
    }
  }
}

}  // namespace

int64_t scratch_growths() { return g_growths.load(std::memory_order_relaxed); }

int64_t block_rows(const Microkernel& uk) { return round_up(uk.mc, uk.mr); }
int64_t tall_rows(const Microkernel& uk) { return round_up(960, block_rows(uk)); }
int64_t block_cols(const Microkernel& uk) { return round_up(256, uk.nr); }

Epilogue store_epilogue(const StoreC& s) { return Epilogue{store_block, &s}; }

void run(const Microkernel& uk, const Problem& p, const Epilogue& ep) {
  TIERMOE_ASSERT(!p.b_source, "run() packs B from p.b; a BSource's products call run_block");
  if (p.M == 0 || p.N == 0) return;
  const int64_t mc = block_rows(uk);
  // With more than one block of rows, each block would pack the same B
  // again: pack all of it once instead (up to a cap; the LM head's weight
  // stays packed block by block).
  constexpr int64_t kSharedPackCap = int64_t(32) << 20;
  if (!p.b_packed && p.M > mc && p.K > 0) {
    const int64_t bytes = packed_b_bytes(uk, p.K, p.N);
    if (bytes <= kSharedPackCap) {
      void* packed = scratch().shared_b.get(bytes);
      pack_b_all(uk, p.b, p.K, p.N, packed);
      Problem q = p;
      q.b_packed = packed;
      run(uk, q, ep);
      return;
    }
  }
  // Past that cap (the LM head: B is the [V, D] weight), a task takes tall
  // blocks of rows instead, up to tall_rows(uk), so each B panel it packs serves
  // all of them: B is packed once per tall block instead of once per block
  // of mc rows. Every C element still sums its K in the same kc steps
  // through the same microkernel, so the bits are those of mc-row blocks.
  const int64_t rows_per_task =
      !p.b_packed && p.M > mc ? std::min(round_up(p.M, uk.mr), tall_rows(uk)) : mc;
  // A task is a block of rows times a run of column blocks (column_chunk),
  // so a block's A is packed once for the whole run.
  const int64_t m_blocks = ceil_div(p.M, rows_per_task);
  // Tall blocks over a K too long to keep their A (the LM head's dx) pack
  // each step of A once per task for all its columns: one task per thread.
  const int64_t a_over_k = ceil_div(rows_per_task, uk.mr) * a_panel_bytes(uk, kKc) *
                           ceil_div(round_up(p.K, uk.k_step), kKc);
  const bool long_k = rows_per_task > mc && a_over_k > kKeepACap;
  const int64_t chunk = column_chunk(uk, p.N, m_blocks, num_threads(), long_k ? 1 : 4);
  const int64_t n_chunks = ceil_div(p.N, chunk);
  // Threads take contiguous runs of tasks; ordering them along the larger of
  // A and B gives each thread a share of it to stream.
  const bool n_major = p.N >= p.M;
  parallel_for(m_blocks * n_chunks, 1, [&](int64_t t0, int64_t t1) {
    if (uk.thread_begin) uk.thread_begin();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t mb = n_major ? t % m_blocks : t / n_chunks;
      const int64_t nb = n_major ? t / m_blocks : t % n_chunks;
      const int64_t i0 = mb * rows_per_task, j0 = nb * chunk;
      run_block(uk, p, ep, i0, std::min(rows_per_task, p.M - i0), j0, std::min(chunk, p.N - j0));
    }
    if (uk.thread_end) uk.thread_end();
  });
}

int64_t packed_b_bytes(const Microkernel& uk, int64_t K, int64_t N) {
  return ceil_div(N, uk.nr) * b_panel_bytes(uk, round_up(K, uk.k_step));
}

void pack_b_all(const Microkernel& uk, const Mat& b, int64_t K, int64_t N, void* dst) {
  const int64_t Kp = round_up(K, uk.k_step), panels = ceil_div(N, uk.nr);
  const int64_t bytes = b_panel_bytes(uk, Kp);
  parallel_for(panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t jp = p0; jp < p1; ++jp) {
      const int64_t j = jp * uk.nr;
      pack_b(uk, b, j, std::min<int64_t>(uk.nr, N - j), 0, Kp, K,
             static_cast<char*>(dst) + jp * bytes);
    }
  });
}

}  // namespace tiermoe::cpu::gemm
