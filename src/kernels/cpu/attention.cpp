// Flash attention on the GEMM microkernels (kernels/cpu/gemm/), f32 and bf16;
// f64 runs take the plain row path (attention_rows.cpp). Nothing of size
// T x T is stored: queries and keys go in blocks of `blk` (a multiple of the
// microkernel's nr and k_step), and every product of two blocks is a run of
// microkernel calls on operands packed once:
//
//   per (b, kv head), shared by the group's query heads:
//     KT  B(k = p, n = key)    for S = Q K^T
//     Vn  B(k = key, n = c)    for O += P V          (forward)
//     VT  B(k = c, n = key)    for dP = dO V^T       (backward)
//     Kn  B(k = key, n = p)    for dQ += dS K        (backward)
//   per query head (backward): Q and dO as A (k = p), and as B (k = query)
//   for dK += dS^T Q and dV += P^T dO
//   per block pair: P, dS (f32 scratch) packed as A, converted by the packing
//   to what the microkernel reads (kept f32 by the FMA kernels, rounded to
//   bf16 by AMX and VDPBF16PS).
//
// forward   tasks (b, h, query block): for each key block that a query of the
//           block sees, S = Q K^T (tiles no query sees skipped), the online
//           softmax (running max m and sum l per row, the accumulator O
//           rescaled when m grows), O += P V; then out = O / l, lse = m + log l.
// backward  tasks (b, h): for each key block j, for each query block i that
//           sees it: S and dP recomputed, p = exp(s - lse),
//           ds = p (dp - D) / sqrt(P) with D_i = dO_i . out_i (FlashAttention-2's
//           row term), then dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i += dS K_j.
//           dQ is the task's own; dK and dV of each head go to partial sums
//           that a last pass adds over the group's heads in head order.
// Visibility: query i of row b sees keys [lo(b, i), i], lo its document's
// first token raised by a sliding window (attention_options.h), so a window
// only skips more blocks. A learned sink is the start value of the running
// max and sum (m = sink, l = 1), so lse includes it and the backward's p and
// ds need nothing else; its gradient comes from lse and D per row. The q.k
// and v head dims are kept apart (Pk, Pv: MLA's split heads), and the
// scores' scale is the options' (MLA's mscale).
//
// Every output element is written by one task (the partial sums by one task
// each, added in a fixed order), and a task's work does not depend on the
// thread count: results do not either. Against ref:: (kernels/attention.h)
// it differs by the online softmax's rescaling, by D taken from the rounded
// output, and, on AMX and AVX-512 BF16, by P and dS rounded to bf16.
#include "tiermoe/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "../attention_options.h"
#include "../nn_common.h"
#include "attention_math.h"
#include "attention_rows.h"
#include "gemm/driver.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/cpu_isa.h"

namespace tiermoe::cpu {

using namespace nn_detail;
using gemm::ceil_div;
using gemm::round_up;

namespace {

using flash::F8;

// The problem and its blocking on one microkernel.
struct Flash {
  const gemm::Microkernel* uk = nullptr;
  DType dt = DType::f32;
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, Pk = 0, Pv = 0;
  int64_t blk = 0;   // rows of a query block and of a key block
  int64_t rows = 0;  // blk rounded up to whole A panels (mr)
  int64_t Pk_k = 0;  // Pk padded to k_step (the reduction of S)
  int64_t Pv_k = 0;  // Pv padded to k_step (the reduction of dP)
  int64_t Pk_n = 0;  // Pk padded to nr (columns of dQ, dK)
  int64_t Pv_n = 0;  // Pv padded to nr (columns of O, dV)
  int64_t T_k = 0;   // T padded to k_step (keys or queries as a reduction)
  float scale = 0;
  AttentionOptions opt;

  int64_t group() const { return Hq / Hkv; }
  int64_t blocks() const { return ceil_div(T, blk); }
  int64_t lo(int64_t b, int64_t i) const { return first_key(opt, b, T, i); }
  int64_t a_bytes(int64_t kc) const { return gemm::a_panel_bytes(*uk, kc); }
  int64_t b_bytes(int64_t kc) const { return gemm::b_panel_bytes(*uk, kc); }
  // Element offsets of (b, t, head) rows in a [B, T, H, P] tensor.
  int64_t q_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hq + h) * Pk; }
  int64_t o_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hq + h) * Pv; }
  int64_t k_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hkv + h) * Pk; }
  int64_t v_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hkv + h) * Pv; }
};

Flash plan(const AttentionDims& d, DType dt, const AttentionOptions& opt) {
  Flash f;
  f.uk = &gemm::microkernel(cpu_isa(), dt);
  const gemm::Microkernel& uk = *f.uk;
  f.dt = dt;
  f.B = d.B, f.T = d.T, f.Hq = d.Hq, f.Hkv = d.Hkv, f.Pk = d.P, f.Pv = d.Pv;
  f.blk = round_up(128, std::lcm<int64_t>(uk.nr, uk.k_step));
  f.rows = round_up(f.blk, uk.mr);
  f.Pk_k = round_up(f.Pk, uk.k_step), f.Pv_k = round_up(f.Pv, uk.k_step);
  f.Pk_n = round_up(f.Pk, uk.nr), f.Pv_n = round_up(f.Pv, uk.nr);
  f.T_k = round_up(f.T, uk.k_step);
  f.scale = float(score_scale(opt, d));
  f.opt = opt;
  return f;
}

// `bytes` of packed panels, counted as activations while the kernel runs.
Tensor pack_buffer(int64_t bytes) {
  return Tensor::empty({std::max<int64_t>(1, ceil_div(bytes, 2))}, DType::bf16,
                       MemTag::activations);
}

// A 64-byte aligned scratch of floats (or packed panels), per thread.
class Scratch {
 public:
  explicit Scratch(int64_t bytes) : bytes_(round_up(std::max<int64_t>(bytes, 64), 64)) {
    p_ = static_cast<char*>(std::aligned_alloc(64, size_t(bytes_)));
    if (!p_) throw std::bad_alloc();
  }
  ~Scratch() { std::free(p_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  char* bytes() { return p_; }
  float* floats() { return reinterpret_cast<float*>(p_); }
  void zero() { std::memset(p_, 0, size_t(bytes_)); }

 private:
  char* p_ = nullptr;
  int64_t bytes_ = 0;
};

// B (K x N) from `src`, packed whole as the microkernel's B panels over
// K padded to k_step (panel jp at jp * b_bytes(round_up(K, k_step)); the
// rows from k0 on at b_bytes(k0) into each panel).
void pack_b_whole(const Flash& f, const gemm::Mat& src, int64_t K, int64_t N, char* dst) {
  const int64_t Kp = round_up(K, f.uk->k_step);
  for (int64_t jp = 0; jp * f.uk->nr < N; ++jp) {
    const int64_t j0 = jp * f.uk->nr;
    gemm::pack_b(*f.uk, src, j0, std::min<int64_t>(f.uk->nr, N - j0), 0, Kp, K,
                 dst + jp * f.b_bytes(Kp));
  }
}
int64_t whole_b_bytes(const Flash& f, int64_t K, int64_t N) {
  return ceil_div(N, f.uk->nr) * f.b_bytes(round_up(K, f.uk->k_step));
}

// A (rows x K) from `src`, packed as the microkernel's A panels over kc.
void pack_a_rows(const Flash& f, const gemm::Mat& src, int64_t rows, int64_t kc, int64_t K,
                 char* dst) {
  for (int64_t ip = 0; ip * f.uk->mr < rows; ++ip) {
    const int64_t r0 = ip * f.uk->mr;
    gemm::pack_a(*f.uk, src, r0, std::min<int64_t>(f.uk->mr, rows - r0), 0, kc, K,
                 dst + ip * f.a_bytes(kc));
  }
}

// C (ldc floats a row) (+)= A . B over kc, A panels [0, m_panels) and B
// panels [0, n_panels) (panel jp at b + jp * b_stride), skipping the tiles
// `skip` names. Each B panel stays in L1 while A's panels stream past it.
template <class Skip>
void gemm_tiles(const Flash& f, int64_t kc, const char* a, int64_t m_panels, const char* b,
                int64_t b_stride, int64_t n_panels, float* c, int64_t ldc, bool load_c,
                const Skip& skip) {
  const gemm::Microkernel& uk = *f.uk;
  for (int64_t ip = 0; ip < m_panels; ++ip) {
    for (int64_t jp = 0; jp < n_panels; ++jp) {
      if (skip(ip, jp)) continue;
      uk.run(kc, a + ip * f.a_bytes(kc), b + jp * b_stride, c + ip * uk.mr * ldc + jp * uk.nr, ldc,
             load_c);
    }
  }
}
bool no_skip(int64_t, int64_t) { return false; }

// A pair of blocks: queries [i0, i0 + qrows) of row b against keys
// [j0, j0 + kv).
struct Pair {
  int64_t b, i0, qrows, j0, kv;
  // The keys query i0 + r sees in the block: [a, e) (empty when a >= e).
  void keys(const Flash& f, int64_t r, int64_t& a, int64_t& e) const {
    const int64_t i = i0 + r;
    a = std::max(j0, f.lo(b, i));
    e = std::min(j0 + kv, i + 1);
  }
  // Whether no query of the tile (A panel ip, B panel jp) of S sees any of
  // its keys: all after the panel's last query, or all before its first
  // query's first key (first keys never decrease along a row).
  bool masked(const Flash& f, int64_t ip, int64_t jp) const {
    const int64_t q0 = i0 + ip * f.uk->mr, q1 = std::min(q0 + f.uk->mr, i0 + qrows) - 1;
    const int64_t k0 = j0 + jp * f.uk->nr, k1 = k0 + f.uk->nr - 1;
    return k0 > q1 || k1 < f.lo(b, q0);
  }
};

// The score of a raw dot product as kernels/attention.h rounds it.
template <class T>
F8 score8(F8 dot, F8 scale) {
  if constexpr (std::is_same_v<T, bf16>) {
    return flash::round_bf16_8(_mm256_mul_ps(flash::round_bf16_8(dot), scale));
  } else {
    return _mm256_mul_ps(dot, scale);
  }
}

// ---------------------------------------------------------------- forward

// The vectors of a block row that hold keys [a, e): [c0, c1), in steps of
// 8. Only those are computed (the rest of the row's probabilities are zero);
// masks are needed only where a vector straddles a or e.
struct RowSpan {
  int64_t c0, c1;
  bool masked;
  RowSpan(int64_t a, int64_t e) : c0(a / 8 * 8), c1(round_up(e, 8)), masked(a % 8 || e % 8) {}
  void zero_outside(float* row, int64_t blk) const {
    std::fill(row, row + c0, 0.f);
    std::fill(row + c1, row + blk, 0.f);
  }
};

// One query row's online-softmax step over a key block: scores s_r (raw dot
// products, blk of them, those outside [a, e) ignored; overwritten with the
// scaled scores) become p_r = exp(s - m) with m the running max; the running
// sum l and the row of the accumulator o_r (width Pv_n) are rescaled when m
// grows.
template <class T>
void softmax_step(const Flash& f, float* s_r, float* p_r, int64_t a, int64_t e, float& m,
                  float& l, float* o_r) {
  const F8 scale = _mm256_set1_ps(f.scale), neg_inf = _mm256_set1_ps(-INFINITY);
  const RowSpan span(a, e);
  F8 mx = neg_inf;
  for (int64_t c = span.c0; c < span.c1; c += 8) {
    F8 s = score8<T>(_mm256_loadu_ps(s_r + c), scale);
    if (span.masked) s = _mm256_blendv_ps(neg_inf, s, flash::in_range(c, a, e));
    _mm256_storeu_ps(s_r + c, s);
    mx = _mm256_max_ps(mx, s);
  }
  const float m_new = std::max(m, flash::hmax8(mx));
  const F8 mv = _mm256_set1_ps(m_new);
  F8 sum = _mm256_setzero_ps();
  for (int64_t c = span.c0; c < span.c1; c += 8) {
    F8 p = flash::exp8(_mm256_sub_ps(_mm256_loadu_ps(s_r + c), mv));
    if (span.masked) p = _mm256_and_ps(p, flash::in_range(c, a, e));
    _mm256_storeu_ps(p_r + c, p);
    sum = _mm256_add_ps(sum, p);
  }
  span.zero_outside(p_r, f.blk);
  // alpha = exp(m - m_new): 0 before the first key (m = -inf), 1 while the
  // max stays.
  const float alpha =
      m == -INFINITY ? 0.f : _mm256_cvtss_f32(flash::exp8(_mm256_set1_ps(m - m_new)));
  if (alpha != 1.f) {
    const F8 av = _mm256_set1_ps(alpha);
    for (int64_t c = 0; c < f.Pv_n; c += 8) {
      _mm256_storeu_ps(o_r + c, _mm256_mul_ps(_mm256_loadu_ps(o_r + c), av));
    }
  }
  l = l * alpha + flash::hsum8(sum);
  m = m_new;
}

template <class T>
void flash_forward(const Flash& f, Tensor& out, Tensor& lse_BTH, const Tensor& q, const Tensor& k,
                   const Tensor& v) {
  const gemm::Microkernel& uk = *f.uk;
  const int64_t BK = f.B * f.Hkv, nb = f.blocks(), m_max = f.rows / uk.mr;
  const int64_t kt_bytes = whole_b_bytes(f, f.Pk, f.T), vn_bytes = whole_b_bytes(f, f.T, f.Pv);
  Tensor kv_packs = pack_buffer(BK * (kt_bytes + vn_bytes));
  char* packs = static_cast<char*>(kv_packs.raw());
  const T* qs = q.data<T>();
  const T* ks = k.data<T>();
  const T* vs = v.data<T>();
  parallel_for(BK, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / f.Hkv, h = t % f.Hkv;
      char* kt = packs + t * (kt_bytes + vn_bytes);
      pack_b_whole(f, {ks + f.k_at(b, 0, h), 1, f.Hkv * f.Pk, f.dt}, f.Pk, f.T, kt);
      pack_b_whole(f, {vs + f.v_at(b, 0, h), f.Hkv * f.Pv, 1, f.dt}, f.T, f.Pv, kt + kt_bytes);
    }
  });
  T* outs = out.data<T>();
  float* lses = lse_BTH.data<float>();
  // Tasks (b, h, query block), each at least ~1M multiply-adds per chunk.
  const int64_t tasks = f.B * f.Hq * nb;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 20) / (f.blk * f.T * (f.Pk + f.Pv)));
  parallel_for(tasks, grain, [&](int64_t t0, int64_t t1) {
    if (uk.thread_begin) uk.thread_begin();
    Scratch qa(m_max * f.a_bytes(f.Pk_k)), pa(m_max * f.a_bytes(f.blk));
    Scratch s(f.rows * f.blk * 4), p(f.rows * f.blk * 4), o(f.rows * f.Pv_n * 4);
    std::vector<float> m(size_t(f.rows)), l(size_t(f.rows));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (f.Hq * nb), h = t / nb % f.Hq, qb = t % nb;
      const int64_t i0 = qb * f.blk, qrows = std::min(f.blk, f.T - i0);
      const int64_t m_panels = ceil_div(qrows, uk.mr);
      const char* kt = packs + (b * f.Hkv + h / f.group()) * (kt_bytes + vn_bytes);
      const char* vn = kt + kt_bytes;
      pack_a_rows(f, {qs + f.q_at(b, i0, h), f.Hq * f.Pk, 1, f.dt}, qrows, f.Pk_k, f.Pk,
                  qa.bytes());
      o.zero();
      // The sink as a key already seen: exp(sink - m) = 1 in the sum.
      const float sink = sink_logit<float>(f.opt, h);
      std::fill(m.begin(), m.end(), sink);
      std::fill(l.begin(), l.end(), f.opt.sinks_H ? 1.f : 0.f);
      for (int64_t kb = f.lo(b, i0) / f.blk; kb <= qb; ++kb) {
        const Pair pr{b, i0, qrows, kb * f.blk, std::min(f.blk, f.T - kb * f.blk)};
        gemm_tiles(f, f.Pk_k, qa.bytes(), m_panels, kt + pr.j0 / uk.nr * f.b_bytes(f.Pk_k),
                   f.b_bytes(f.Pk_k), ceil_div(pr.kv, uk.nr), s.floats(), f.blk, false,
                   [&](int64_t ip, int64_t jp) { return pr.masked(f, ip, jp); });
        for (int64_t r = 0; r < qrows; ++r) {
          int64_t a, e;
          pr.keys(f, r, a, e);
          float* p_r = p.floats() + r * f.blk;
          if (a >= e) {
            std::fill(p_r, p_r + f.blk, 0.f);
            continue;
          }
          softmax_step<T>(f, s.floats() + r * f.blk, p_r, a - pr.j0, e - pr.j0, m[size_t(r)],
                          l[size_t(r)], o.floats() + r * f.Pv_n);
        }
        const int64_t kc = round_up(pr.kv, uk.k_step);
        pack_a_rows(f, {p.floats(), f.blk, 1, DType::f32}, qrows, kc, pr.kv, pa.bytes());
        gemm_tiles(f, kc, pa.bytes(), m_panels, vn + f.b_bytes(pr.j0), f.b_bytes(f.T_k),
                   f.Pv_n / uk.nr, o.floats(), f.Pv_n, true, no_skip);
      }
      for (int64_t r = 0; r < qrows; ++r) {
        const float* o_r = o.floats() + r * f.Pv_n;
        T* dst = outs + f.o_at(b, i0 + r, h);
        for (int64_t c = 0; c < f.Pv; ++c) dst[c] = store<T>(o_r[c] / l[size_t(r)]);
        lses[(b * f.T + i0 + r) * f.Hq + h] = m[size_t(r)] + std::log(l[size_t(r)]);
      }
    }
    if (uk.thread_end) uk.thread_end();
  });
}

// ---------------------------------------------------------------- backward

// One query row of a block pair: p = exp(s - lse) and ds = p (dp - D) scale
// over the keys [a, e) it sees, zero elsewhere.
template <class T>
void probs_and_grads(const Flash& f, const float* s_r, const float* dp_r, int64_t a, int64_t e,
                     float lse, float D, float* p_r, float* ds_r) {
  const F8 scale = _mm256_set1_ps(f.scale), lv = _mm256_set1_ps(lse), Dv = _mm256_set1_ps(D);
  const RowSpan span(a, e);
  for (int64_t c = span.c0; c < span.c1; c += 8) {
    const F8 s = score8<T>(_mm256_loadu_ps(s_r + c), scale);
    F8 p = flash::exp8(_mm256_sub_ps(s, lv));
    F8 dp = _mm256_loadu_ps(dp_r + c);
    if (span.masked) {
      const F8 in = flash::in_range(c, a, e);
      p = _mm256_and_ps(p, in);
      dp = _mm256_and_ps(dp, in);  // masked lanes may be garbage
    }
    _mm256_storeu_ps(p_r + c, p);
    _mm256_storeu_ps(ds_r + c, _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(dp, Dv)), scale));
  }
  span.zero_outside(p_r, f.blk);
  span.zero_outside(ds_r, f.blk);
}

template <class T>
void flash_backward(const Flash& f, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse_BTH, bool accumulate, Tensor* dsinks_H) {
  const gemm::Microkernel& uk = *f.uk;
  const int64_t BK = f.B * f.Hkv, nb = f.blocks(), m_max = f.rows / uk.mr;
  const int64_t kt_bytes = whole_b_bytes(f, f.Pk, f.T), vt_bytes = whole_b_bytes(f, f.Pv, f.T);
  const int64_t kn_bytes = whole_b_bytes(f, f.T, f.Pk), kv_bytes = kt_bytes + vt_bytes + kn_bytes;
  Tensor kv_packs = pack_buffer(BK * kv_bytes);  // as attention_backward_scratch_bytes counts
  char* packs = static_cast<char*>(kv_packs.raw());
  const T *qs = q.data<T>(), *ks = k.data<T>(), *vs = v.data<T>();
  const T *dos = dout.data<T>(), *os = out.data<T>();
  parallel_for(BK, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / f.Hkv, h = t % f.Hkv;
      char* kt = packs + t * kv_bytes;
      pack_b_whole(f, {ks + f.k_at(b, 0, h), 1, f.Hkv * f.Pk, f.dt}, f.Pk, f.T, kt);
      pack_b_whole(f, {vs + f.v_at(b, 0, h), 1, f.Hkv * f.Pv, f.dt}, f.Pv, f.T, kt + kt_bytes);
      pack_b_whole(f, {ks + f.k_at(b, 0, h), f.Hkv * f.Pk, 1, f.dt}, f.T, f.Pk,
                   kt + kt_bytes + vt_bytes);
    }
  });
  // Each head's dK and dV ([B, Hq, T, P], f32), added over the group below.
  Tensor part_k = Tensor::empty({f.B * f.Hq * f.T * f.Pk}, DType::f32, MemTag::activations);
  Tensor part_v = Tensor::empty({f.B * f.Hq * f.T * f.Pv}, DType::f32, MemTag::activations);
  const float* lses = lse_BTH.data<float>();
  T* dqs = dq.data<T>();
  // Each (b, h)'s share of dsink_h, added over b below.
  std::vector<float> dsink_BH(dsinks_H ? size_t(f.B * f.Hq) : 0);
  const int64_t qa_bytes = m_max * f.a_bytes(f.Pk_k), da_bytes = m_max * f.a_bytes(f.Pv_k);
  parallel_for(f.B * f.Hq, 1, [&](int64_t t0, int64_t t1) {
    if (uk.thread_begin) uk.thread_begin();
    Scratch qa(nb * qa_bytes), doa(nb * da_bytes);
    Scratch qn(whole_b_bytes(f, f.T, f.Pk)), don(whole_b_bytes(f, f.T, f.Pv));
    Scratch s(f.rows * f.blk * 4), dp(f.rows * f.blk * 4), p(f.rows * f.blk * 4),
        ds(f.rows * f.blk * 4);
    Scratch pta(m_max * f.a_bytes(f.blk)), dsa(m_max * f.a_bytes(f.blk));
    Scratch gq(nb * f.rows * f.Pk_n * 4), gk(f.rows * f.Pk_n * 4), gv(f.rows * f.Pv_n * 4);
    std::vector<float> D(size_t(f.T)), lse(size_t(f.T));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / f.Hq, h = t % f.Hq;
      const char* kt = packs + (b * f.Hkv + h / f.group()) * kv_bytes;
      const char *vt = kt + kt_bytes, *kn = vt + vt_bytes;
      const gemm::Mat q_rows{qs + f.q_at(b, 0, h), f.Hq * f.Pk, 1, f.dt};
      const gemm::Mat do_rows{dos + f.o_at(b, 0, h), f.Hq * f.Pv, 1, f.dt};
      for (int64_t qb = 0; qb < nb; ++qb) {
        const int64_t i0 = qb * f.blk, qrows = std::min(f.blk, f.T - i0);
        pack_a_rows(f, {qs + f.q_at(b, i0, h), f.Hq * f.Pk, 1, f.dt}, qrows, f.Pk_k, f.Pk,
                    qa.bytes() + qb * qa_bytes);
        pack_a_rows(f, {dos + f.o_at(b, i0, h), f.Hq * f.Pv, 1, f.dt}, qrows, f.Pv_k, f.Pv,
                    doa.bytes() + qb * da_bytes);
      }
      pack_b_whole(f, q_rows, f.T, f.Pk, qn.bytes());
      pack_b_whole(f, do_rows, f.T, f.Pv, don.bytes());
      for (int64_t i = 0; i < f.T; ++i) {
        // D_i = dO_i . out_i, out as the forward stored it.
        float sum = 0;
        for (int64_t c = 0; c < f.Pv; ++c) {
          sum += load(dos[f.o_at(b, i, h) + c]) * load(os[f.o_at(b, i, h) + c]);
        }
        D[size_t(i)] = sum;
        lse[size_t(i)] = lses[(b * f.T + i) * f.Hq + h];
      }
      if (dsinks_H) {
        // The sink column's ds = -p_sink D (it carries no value: dp = 0).
        const float sink = sink_logit<float>(f.opt, h);
        float sum = 0;
        for (int64_t i = 0; i < f.T; ++i) sum -= std::exp(sink - lse[size_t(i)]) * D[size_t(i)];
        dsink_BH[size_t(t)] = sum;
      }
      gq.zero();
      for (int64_t kb = 0; kb < nb; ++kb) {
        const int64_t j0 = kb * f.blk, kv = std::min(f.blk, f.T - j0);
        gk.zero();
        gv.zero();
        for (int64_t qb = kb; qb < nb; ++qb) {
          const Pair pr{b, qb * f.blk, std::min(f.blk, f.T - qb * f.blk), j0, kv};
          if (f.lo(b, pr.i0) >= j0 + kv) break;  // so do all later queries' first keys
          const int64_t m_panels = ceil_div(pr.qrows, uk.mr), k_panels = ceil_div(kv, uk.nr);
          auto masked = [&](int64_t ip, int64_t jp) { return pr.masked(f, ip, jp); };
          gemm_tiles(f, f.Pk_k, qa.bytes() + qb * qa_bytes, m_panels,
                     kt + j0 / uk.nr * f.b_bytes(f.Pk_k), f.b_bytes(f.Pk_k), k_panels, s.floats(),
                     f.blk, false, masked);
          gemm_tiles(f, f.Pv_k, doa.bytes() + qb * da_bytes, m_panels,
                     vt + j0 / uk.nr * f.b_bytes(f.Pv_k), f.b_bytes(f.Pv_k), k_panels, dp.floats(),
                     f.blk, false, masked);
          for (int64_t r = 0; r < pr.qrows; ++r) {
            int64_t a, e;
            pr.keys(f, r, a, e);
            if (a >= e) {
              // A query whose document starts past these keys (a later row of
              // the block may still see them): nothing, as in the forward.
              std::fill(p.floats() + r * f.blk, p.floats() + (r + 1) * f.blk, 0.f);
              std::fill(ds.floats() + r * f.blk, ds.floats() + (r + 1) * f.blk, 0.f);
              continue;
            }
            const int64_t i = pr.i0 + r;
            probs_and_grads<T>(f, s.floats() + r * f.blk, dp.floats() + r * f.blk, a - j0, e - j0,
                               lse[size_t(i)], D[size_t(i)], p.floats() + r * f.blk,
                               ds.floats() + r * f.blk);
          }
          // dV += P^T dO and dK += dS^T Q: keys are the rows, queries the reduction.
          const int64_t kq = round_up(pr.qrows, uk.k_step), key_panels = ceil_div(kv, uk.mr);
          pack_a_rows(f, {p.floats(), 1, f.blk, DType::f32}, kv, kq, pr.qrows, pta.bytes());
          gemm_tiles(f, kq, pta.bytes(), key_panels, don.bytes() + f.b_bytes(pr.i0),
                     f.b_bytes(f.T_k), f.Pv_n / uk.nr, gv.floats(), f.Pv_n, true, no_skip);
          pack_a_rows(f, {ds.floats(), 1, f.blk, DType::f32}, kv, kq, pr.qrows, pta.bytes());
          gemm_tiles(f, kq, pta.bytes(), key_panels, qn.bytes() + f.b_bytes(pr.i0),
                     f.b_bytes(f.T_k), f.Pk_n / uk.nr, gk.floats(), f.Pk_n, true, no_skip);
          // dQ += dS K: queries the rows, keys the reduction.
          const int64_t kk = round_up(kv, uk.k_step);
          pack_a_rows(f, {ds.floats(), f.blk, 1, DType::f32}, pr.qrows, kk, kv, dsa.bytes());
          gemm_tiles(f, kk, dsa.bytes(), m_panels, kn + f.b_bytes(j0), f.b_bytes(f.T_k),
                     f.Pk_n / uk.nr, gq.floats() + qb * f.rows * f.Pk_n, f.Pk_n, true, no_skip);
        }
        float* pk = part_k.data<float>() + ((b * f.Hq + h) * f.T + j0) * f.Pk;
        float* pv = part_v.data<float>() + ((b * f.Hq + h) * f.T + j0) * f.Pv;
        for (int64_t r = 0; r < kv; ++r) {
          std::memcpy(pk + r * f.Pk, gk.floats() + r * f.Pk_n, size_t(f.Pk) * 4);
          std::memcpy(pv + r * f.Pv, gv.floats() + r * f.Pv_n, size_t(f.Pv) * 4);
        }
      }
      for (int64_t i = 0; i < f.T; ++i) {
        const float* g = gq.floats() + (i / f.blk * f.rows + i % f.blk) * f.Pk_n;
        T* dst = dqs + f.q_at(b, i, h);
        for (int64_t c = 0; c < f.Pk; ++c) put(dst[c], g[c], accumulate);
      }
    }
    if (uk.thread_end) uk.thread_end();
  });
  if (dsinks_H) {
    float* ds = dsinks_H->data<float>();
    for (int64_t h = 0; h < f.Hq; ++h) {
      for (int64_t b = 0; b < f.B; ++b) ds[h] += dsink_BH[size_t(b * f.Hq + h)];
    }
  }
  // dK, dV of each kv head: its query heads' partial sums in head order.
  T *dks = dk.data<T>(), *dvs = dv.data<T>();
  const float *pks = part_k.data<float>(), *pvs = part_v.data<float>();
  parallel_for(f.B * f.T, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t bt = r0; bt < r1; ++bt) {
      const int64_t b = bt / f.T, t = bt % f.T;
      for (int64_t kvh = 0; kvh < f.Hkv; ++kvh) {
        auto reduce = [&](T* dst, const float* part, int64_t P) {
          for (int64_t c = 0; c < P; ++c) {
            float sum = 0;
            for (int64_t h = kvh * f.group(); h < (kvh + 1) * f.group(); ++h) {
              sum += part[((b * f.Hq + h) * f.T + t) * P + c];
            }
            put(dst[c], sum, accumulate);
          }
        };
        reduce(dks + f.k_at(b, t, kvh), pks, f.Pk);
        reduce(dvs + f.v_at(b, t, kvh), pvs, f.Pv);
      }
    }
  });
}

// The backward's packs of every kv head (KT, VT, Kn), in pack_buffer's
// whole bf16 elements.
int64_t backward_kv_pack_bytes(const Flash& f) {
  const int64_t kv_bytes =
      whole_b_bytes(f, f.Pk, f.T) + whole_b_bytes(f, f.Pv, f.T) + whole_b_bytes(f, f.T, f.Pk);
  return 2 * std::max<int64_t>(1, ceil_div(f.B * f.Hkv * kv_bytes, 2));
}

}  // namespace

size_t attention_backward_scratch_bytes(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t P,
                                        int64_t Pv, DType dt) {
  if (dt == DType::f64 || cpu_isa() == CpuIsa::onednn || B * T * Hq == 0) return 0;
  const Flash f = plan({B, T, Hq, Hkv, P, Pv}, dt, {});
  return size_t(backward_kv_pack_bytes(f)) + size_t(B * Hq * T * (P + Pv)) * 4;
}

void attention_forward(Tensor& out, Tensor& lse_BTH, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionOptions& opt) {
  const AttentionDims d = check_attention(q, k, v, lse_BTH, "attention_forward");
  check_attention_out(out, d, q, "out", "attention_forward");
  check_attention_options(opt, d, q.dtype(), "attention_forward");
  if (q.dtype() == DType::f64 || cpu_isa() == CpuIsa::onednn) {
    attention_rows_forward(out, lse_BTH, q, k, v, opt);
    return;
  }
  const Flash f = plan(d, q.dtype(), opt);
  visit_dtype(q.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, double>) flash_forward<T>(f, out, lse_BTH, q, k, v);
  });
}

void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse_BTH,
                        const AttentionOptions& opt, bool accumulate, Tensor* dsinks_H) {
  const AttentionDims d = check_attention(q, k, v, lse_BTH, "attention_backward");
  check_attention_options(opt, d, q.dtype(), "attention_backward");
  check_dsinks(dsinks_H, opt, d, q.dtype(), "attention_backward");
  check_attention_out(dout, d, q, "dout", "attention_backward");
  check_attention_out(out, d, q, "out", "attention_backward");
  check_elementwise(dq, "dq", q, "q", "attention_backward");
  check_elementwise(dk, "dk", k, "k", "attention_backward");
  check_elementwise(dv, "dv", v, "v", "attention_backward");
  if (q.dtype() == DType::f64 || cpu_isa() == CpuIsa::onednn) {
    attention_rows_backward(dq, dk, dv, dout, q, k, v, lse_BTH, opt, accumulate, dsinks_H);
    return;
  }
  const Flash f = plan(d, q.dtype(), opt);
  visit_dtype(q.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, double>) {
      flash_backward<T>(f, dq, dk, dv, dout, q, k, v, out, lse_BTH, accumulate, dsinks_H);
    }
  });
}

}  // namespace tiermoe::cpu
