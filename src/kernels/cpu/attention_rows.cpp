// The f64 attention (attention.cpp runs f32 and bf16 as a flash attention on
// the GEMM microkernels): the parity mode's plain path, one query row at a
// time, nothing of size T x T stored, the forward bitwise ref::'s. Inputs
// are first repacked head-major in the math dtype: q, dout, v as [B, H, T, P]
// rows, and k, v also transposed, [B, Hkv, P, T], so a row of scores
// s_j = sum_p q_p k_jp is built by P vectorized passes over j (no horizontal
// reductions). Each score then sums over p in order, exactly as ref:: does.
//
// forward   tasks (b, h, block of query rows): scores, softmax and P.v of one
//           row at a time in O(T) scratch; saves the row's log-sum-exp.
// backward  pass 1, tasks (b, h, query block): dq and the row term
//           D_i = sum_j p_ij dp_ij, recomputing p from lse.
//           pass 2, tasks (b, kv head, key block): dk, dv, recomputing p and
//           dp for every query row of the group that sees the key.
// Each output element is owned by one task and summed in a fixed order, so
// results do not depend on the thread count. The forward equals ref::'s bit
// for bit; backward differs by p = exp(s - lse) against ref's exp(s - m) / sum
// and in the summation order of dk and dv (ulps).
#include "attention_rows.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../attention_options.h"
#include "../nn_common.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {

constexpr int64_t kRowBlock = 16;  // query rows (or keys) per task

// Tasks per thread chunk: at least ~1M multiply-adds, so small problems (a
// short sequence, a test) stay on one thread instead of paying for a
// parallel region per call.
int64_t task_grain(int64_t Tn, int64_t P) {
  return std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(kRowBlock * Tn * P, 1));
}

template <class A>
inline void axpy(A* y, A a, const A* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// x [B, T, H, P] in T  ->  [B, H, T, P] in the math dtype, or transposed
// [B, H, P, T] with `transpose`.
template <class T>
std::vector<acc_t<T>> pack_head_major(const Tensor& x, int64_t B, int64_t Tn, int64_t H, int64_t P,
                                      bool transpose = false) {
  std::vector<acc_t<T>> out(static_cast<size_t>(x.numel()));
  const T* src = x.data<T>();
  parallel_for(B * Tn, std::max<int64_t>(1, 4096 / std::max<int64_t>(H * P, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t bt = begin; bt < end; ++bt) {
                   int64_t b = bt / Tn, t = bt % Tn;
                   for (int64_t h = 0; h < H; ++h) {
                     const T* s = src + (bt * H + h) * P;
                     acc_t<T>* head = out.data() + (b * H + h) * Tn * P;
                     for (int64_t p = 0; p < P; ++p) {
                       (transpose ? head[p * Tn + t] : head[t * P + p]) = load(s[p]);
                     }
                   }
                 }
               });
  return out;
}

// dots[j - j0] = sum over p, in order, of x_p * yT[p][j] for j in [j0, j1):
// one query row against a run of keys (or of values, for dout . v).
template <class A>
inline void dot_run(A* dots, const A* x, const A* yT, int64_t P, int64_t Tn, int64_t j0,
                    int64_t j1) {
  std::fill(dots, dots + (j1 - j0), A(0));
  for (int64_t p = 0; p < P; ++p) axpy(dots, x[p], yT + p * Tn + j0, j1 - j0);
}

// Rounds raw dot products to the scores HF's eager bf16 code would produce
// (plain f32/f64 math otherwise); forward and both backward passes use it.
template <class T>
inline void to_scores(acc_t<T>* s, int64_t n, acc_t<T> scale) {
  for (int64_t j = 0; j < n; ++j) s[j] = round_to<T>(round_to<T>(s[j]) * scale);
}

}  // namespace

// A query row's scores run over the keys it sees, [j0, i]; scratch index
// j - j0 holds key j. The sink joins the max, and the sum last, as in ref::.
void attention_rows_forward(Tensor& out, Tensor& lse_BTH, const Tensor& q, const Tensor& k,
                            const Tensor& v, const AttentionOptions& opt) {
  const AttentionDims d = check_attention(q, k, v, lse_BTH, "attention_forward");
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const A scale = A(score_scale(opt, d));
    const int64_t P = d.P, Pv = d.Pv, Tn = d.T;
    std::vector<A> kT = pack_head_major<T>(k, d.B, Tn, d.Hkv, P, /*transpose=*/true);
    std::vector<A> vp = pack_head_major<T>(v, d.B, Tn, d.Hkv, Pv);
    const T* qs = q.data<T>();
    T* outs = out.data<T>();
    A* lses = lse_BTH.data<A>();
    int64_t blocks = (Tn + kRowBlock - 1) / kRowBlock;
    parallel_for(d.B * d.Hq * blocks, task_grain(Tn, P), [&](int64_t begin, int64_t end) {
      std::vector<A> qi(static_cast<size_t>(P)), o(static_cast<size_t>(Pv));
      std::vector<A> s(static_cast<size_t>(Tn));
      for (int64_t task = begin; task < end; ++task) {
        int64_t b = task / (d.Hq * blocks), h = task / blocks % d.Hq, blk = task % blocks;
        const A* kTh = kT.data() + (b * d.Hkv + h / d.group()) * P * Tn;
        const A* vh = vp.data() + (b * d.Hkv + h / d.group()) * Tn * Pv;
        for (int64_t i = blk * kRowBlock; i < std::min(Tn, (blk + 1) * kRowBlock); ++i) {
          int64_t at = (b * Tn + i) * d.Hq + h;
          for (int64_t c = 0; c < P; ++c) qi[size_t(c)] = load(qs[at * P + c]);
          const int64_t j0 = first_key(opt, b, Tn, i), n = i + 1 - j0;
          dot_run(s.data(), qi.data(), kTh, P, Tn, j0, i + 1);
          to_scores<T>(s.data(), n, scale);
          const A sink = sink_logit<A>(opt, h);
          A m = -INFINITY;
          for (int64_t j = 0; j < n; ++j) m = std::max(m, s[size_t(j)]);
          m = std::max(m, sink);
          A sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            s[size_t(j)] = std::exp(s[size_t(j)] - m);
            sum += s[size_t(j)];
          }
          sum += std::exp(sink - m);
          lses[at] = m + std::log(sum);
          std::fill(o.begin(), o.end(), A(0));
          for (int64_t j = 0; j < n; ++j) {
            axpy(o.data(), A(round_to<T>(s[size_t(j)] / sum)), vh + (j0 + j) * Pv, Pv);
          }
          for (int64_t c = 0; c < Pv; ++c) outs[at * Pv + c] = store<T>(o[size_t(c)]);
        }
      }
    });
  });
}

void attention_rows_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& lse_BTH, const AttentionOptions& opt, bool accumulate,
                             Tensor* dsinks_H) {
  const AttentionDims d = check_attention(q, k, v, lse_BTH, "attention_backward");
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const A scale = A(score_scale(opt, d));
    const int64_t P = d.P, Pv = d.Pv, Tn = d.T, g = d.group();
    std::vector<A> qp = pack_head_major<T>(q, d.B, Tn, d.Hq, P);
    std::vector<A> dop = pack_head_major<T>(dout, d.B, Tn, d.Hq, Pv);
    std::vector<A> kp = pack_head_major<T>(k, d.B, Tn, d.Hkv, P);
    std::vector<A> kT = pack_head_major<T>(k, d.B, Tn, d.Hkv, P, /*transpose=*/true);
    std::vector<A> vT = pack_head_major<T>(v, d.B, Tn, d.Hkv, Pv, /*transpose=*/true);
    // lse and D head-major too: [B, Hq, T].
    std::vector<A> lse(static_cast<size_t>(d.B * d.Hq * Tn)), D(lse.size());
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t t = 0; t < Tn; ++t)
        for (int64_t h = 0; h < d.Hq; ++h)
          lse[size_t((b * d.Hq + h) * Tn + t)] = lse_BTH.data<A>()[(b * Tn + t) * d.Hq + h];
    int64_t blocks = (Tn + kRowBlock - 1) / kRowBlock;

    // Pass 1: dq and D, one query row at a time.
    T* dqs = dq.data<T>();
    parallel_for(d.B * d.Hq * blocks, task_grain(Tn, P), [&](int64_t begin, int64_t end) {
      std::vector<A> p(static_cast<size_t>(Tn)), dp(static_cast<size_t>(Tn));
      std::vector<A> gq(static_cast<size_t>(P));
      for (int64_t task = begin; task < end; ++task) {
        int64_t b = task / (d.Hq * blocks), h = task / blocks % d.Hq, blk = task % blocks;
        int64_t bh = b * d.Hq + h, bkv = b * d.Hkv + h / g;
        const A* kh = kp.data() + bkv * Tn * P;
        const A* kTh = kT.data() + bkv * P * Tn;
        const A* vTh = vT.data() + bkv * Pv * Tn;
        for (int64_t i = blk * kRowBlock; i < std::min(Tn, (blk + 1) * kRowBlock); ++i) {
          const A* qi = qp.data() + (bh * Tn + i) * P;
          const A* doi = dop.data() + (bh * Tn + i) * Pv;
          A lse_i = lse[size_t(bh * Tn + i)];
          const int64_t j0 = first_key(opt, b, Tn, i), n = i + 1 - j0;
          dot_run(p.data(), qi, kTh, P, Tn, j0, i + 1);
          to_scores<T>(p.data(), n, scale);
          dot_run(dp.data(), doi, vTh, Pv, Tn, j0, i + 1);
          A sum_p_dp = 0;
          for (int64_t j = 0; j < n; ++j) {
            p[size_t(j)] = std::exp(p[size_t(j)] - lse_i);
            sum_p_dp += p[size_t(j)] * dp[size_t(j)];
          }
          D[size_t(bh * Tn + i)] = sum_p_dp;
          std::fill(gq.begin(), gq.end(), A(0));
          for (int64_t j = 0; j < n; ++j) {
            axpy(gq.data(), p[size_t(j)] * (dp[size_t(j)] - sum_p_dp) * scale, kh + (j0 + j) * P,
                 P);
          }
          T* dqi = dqs + ((b * Tn + i) * d.Hq + h) * P;
          for (int64_t c = 0; c < P; ++c) put(dqi[c], gq[size_t(c)], accumulate);
        }
      }
    });
    // dsink_h = -sum over (b, i) of p_sink D, in (b, i) order.
    if (dsinks_H) {
      for (int64_t h = 0; h < d.Hq; ++h) {
        const A sink = sink_logit<A>(opt, h);
        A sum = 0;
        for (int64_t b = 0; b < d.B; ++b) {
          for (int64_t t = 0; t < Tn; ++t) {
            const size_t at = size_t((b * d.Hq + h) * Tn + t);
            sum -= std::exp(sink - lse[at]) * D[at];
          }
        }
        dsinks_H->data<A>()[h] += sum;
      }
    }

    // Pass 2: dk and dv, a block of keys against every query row that sees it.
    T* dks = dk.data<T>();
    T* dvs = dv.data<T>();
    parallel_for(d.B * d.Hkv * blocks, task_grain(Tn, P), [&](int64_t begin, int64_t end) {
      std::vector<A> gk(static_cast<size_t>(kRowBlock * P)),
          gv(static_cast<size_t>(kRowBlock * Pv));
      std::vector<A> s(static_cast<size_t>(kRowBlock)), dp(s.size());
      for (int64_t task = begin; task < end; ++task) {
        int64_t b = task / (d.Hkv * blocks), kvh = task / blocks % d.Hkv, blk = task % blocks;
        int64_t bkv = b * d.Hkv + kvh;
        int64_t j0 = blk * kRowBlock, j1 = std::min(Tn, j0 + kRowBlock);
        const A* kTh = kT.data() + bkv * P * Tn;
        const A* vTh = vT.data() + bkv * Pv * Tn;
        std::fill(gk.begin(), gk.end(), A(0));
        std::fill(gv.begin(), gv.end(), A(0));
        for (int64_t h = kvh * g; h < (kvh + 1) * g; ++h) {
          int64_t bh = b * d.Hq + h;
          for (int64_t i = j0; i < Tn; ++i) {
            // First keys never decrease along a row: once a query's begins
            // after this key block, so do all later ones'.
            const int64_t first = first_key(opt, b, Tn, i);
            if (first >= j1) break;
            const A* qi = qp.data() + (bh * Tn + i) * P;
            const A* doi = dop.data() + (bh * Tn + i) * Pv;
            A lse_i = lse[size_t(bh * Tn + i)], D_i = D[size_t(bh * Tn + i)];
            const int64_t j_lo = std::max(j0, first);
            const int64_t j_end = std::min(j1, i + 1);  // causal: keys up to i
            if (j_lo >= j_end) continue;
            dot_run(s.data(), qi, kTh, P, Tn, j_lo, j_end);
            to_scores<T>(s.data(), j_end - j_lo, scale);
            dot_run(dp.data(), doi, vTh, Pv, Tn, j_lo, j_end);
            for (int64_t j = j_lo; j < j_end; ++j) {
              A p = std::exp(s[size_t(j - j_lo)] - lse_i);
              A ds = p * (dp[size_t(j - j_lo)] - D_i) * scale;
              axpy(gk.data() + (j - j0) * P, ds, qi, P);
              axpy(gv.data() + (j - j0) * Pv, A(round_to<T>(p)), doi, Pv);
            }
          }
        }
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t at = ((b * Tn + j) * d.Hkv + kvh) * P;
          const int64_t vat = ((b * Tn + j) * d.Hkv + kvh) * Pv;
          for (int64_t c = 0; c < P; ++c)
            put(dks[at + c], gk[size_t((j - j0) * P + c)], accumulate);
          for (int64_t c = 0; c < Pv; ++c) {
            put(dvs[vat + c], gv[size_t((j - j0) * Pv + c)], accumulate);
          }
        }
      }
    });
  });
}

}  // namespace tiermoe::cpu
