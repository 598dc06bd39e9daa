// The gated delta rule in chunks (kernels/gated_delta.h), as FLA's chunked
// form and transformers' torch_chunk_gated_delta_rule compute it: within a
// chunk of n <= kDeltaChunk tokens the recurrence is a handful of small
// matrix products, and only the state crosses chunks.
//
// One chunk, from the state S0 [Dk, Dv] it starts from, with G the
// cumulative sum of g over the chunk, gam_t = exp(G_t) and
// E[t][j] = exp(G_t - G_j) for j <= t:
//   L[t][j] = beta_t E[t][j] (k_t . k_j), j < t     (strictly lower)
//   [U | W] = (I + L)^-1 [beta v | beta gam k]       (forward substitution)
//   D       = U - W S0                               (each token's delta d_t)
//   O       = (gam q) S0 + (q k^T o E)_{j <= t} D
//   S_n     = gam_{n-1} S0 + (e k)^T D,  e_j = exp(G_{n-1} - G_j)
// which is the recurrence unrolled over the chunk (d_t = beta_t (v_t -
// exp(g_t) S_{t-1}^T k_t) solved for every t at once). Backward runs the same
// products transposed, chunk by chunk in reverse, from each chunk's S0 kept
// by a forward pass over the row.
//
// Chunks never cross a document: each document of a packed row is chunked
// from its own first token with the state zero there, so a document's bits
// do not depend on where it sits in the row. Every (b, head) is computed by
// one task from its own inputs, so the thread count changes no bit.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../gated_delta_check.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {

// Row-major products on contiguous buffers; the innermost loops run along
// the output's rows so they vectorize.
// C[m, n] (+)= X[m, k] Y[k, n]
template <class A>
void mm(A* C, const A* X, const A* Y, int64_t m, int64_t k, int64_t n, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    A* c = C + i * n;
    if (!accumulate) std::fill(c, c + n, A(0));
    for (int64_t p = 0; p < k; ++p) {
      const A x = X[i * k + p];
      const A* y = Y + p * n;
      for (int64_t j = 0; j < n; ++j) c[j] += x * y[j];
    }
  }
}
// C[m, n] (+)= X^T Y, X [k, m], Y [k, n]
template <class A>
void mm_tn(A* C, const A* X, const A* Y, int64_t m, int64_t k, int64_t n, bool accumulate) {
  if (!accumulate) std::fill(C, C + m * n, A(0));
  for (int64_t p = 0; p < k; ++p) {
    const A* y = Y + p * n;
    for (int64_t i = 0; i < m; ++i) {
      const A x = X[p * m + i];
      A* c = C + i * n;
      for (int64_t j = 0; j < n; ++j) c[j] += x * y[j];
    }
  }
}
// out[cols, rows] = in[rows, cols]^T
template <class A>
void transpose(A* out, const A* in, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) out[j * rows + i] = in[i * cols + j];
  }
}
template <class A>
A dot(const A* x, const A* y, int64_t n) {
  A s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

// The documents of row b as [begin, end) token ranges.
std::vector<std::pair<int64_t, int64_t>> documents(const GatedDeltaOptions& opt, int64_t b,
                                                   int64_t T) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t t = 0; t < T; ++t) {
    if (starts_document(opt, b, t, T)) {
      if (!out.empty()) out.back().second = t;
      out.push_back({t, T});
    }
  }
  return out;
}

// One value head's chunk: its inputs widened and what forward computes from
// them before the state enters, then D and the state update.
template <class T>
struct Chunk {
  using A = acc_t<T>;
  const DeltaDims& d;
  int64_t n = 0;  // tokens in this chunk
  std::vector<A> Q, K, V, Kt, G, gam, e, bet, E, KK, QK, L, U, W, D, P, QG, Ke;

  explicit Chunk(const DeltaDims& dims) : d(dims) {
    const size_t C = size_t(kDeltaChunk), Dk = size_t(d.Dk), Dv = size_t(d.Dv);
    for (auto* m : {&Q, &K, &Kt, &W, &QG, &Ke}) m->resize(C * Dk);
    for (auto* m : {&V, &U, &D}) m->resize(C * Dv);
    for (auto* m : {&E, &KK, &QK, &L, &P}) m->resize(C * C);
    for (auto* m : {&G, &gam, &e, &bet}) m->resize(C);
  }

  // Tokens [t0, t0 + n) of row b, value head h: everything but D.
  void prepare(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
               const Tensor& beta, int64_t b, int64_t h, int64_t t0, int64_t len) {
    n = len;
    const int64_t Dk = d.Dk, Dv = d.Dv, hk = h / d.group();
    A cum = 0;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t bt = b * d.T + t0 + t;
      const T* qs = q.data<T>() + (bt * d.Hk + hk) * Dk;
      const T* ks = k.data<T>() + (bt * d.Hk + hk) * Dk;
      const T* vs = v.data<T>() + (bt * d.Hv + h) * Dv;
      for (int64_t i = 0; i < Dk; ++i) Q[t * Dk + i] = load(qs[i]), K[t * Dk + i] = load(ks[i]);
      for (int64_t j = 0; j < Dv; ++j) V[t * Dv + j] = load(vs[j]);
      cum += g.data<A>()[bt * d.Hv + h];
      G[t] = cum;
      gam[t] = std::exp(cum);
      bet[t] = beta.data<A>()[bt * d.Hv + h];
    }
    for (int64_t t = 0; t < n; ++t) e[t] = std::exp(G[n - 1] - G[t]);
    transpose(Kt.data(), K.data(), n, Dk);
    mm(KK.data(), K.data(), Kt.data(), n, Dk, n, false);
    mm(QK.data(), Q.data(), Kt.data(), n, Dk, n, false);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        const A ej = j <= t ? std::exp(G[t] - G[j]) : A(0);
        E[t * n + j] = ej;
        L[t * n + j] = j < t ? bet[t] * ej * KK[t * n + j] : A(0);
        P[t * n + j] = QK[t * n + j] * ej;
      }
    }
    // [U | W] = (I + L)^-1 [beta v | beta gam k], row by row.
    for (int64_t t = 0; t < n; ++t) {
      A* u = U.data() + t * Dv;
      A* w = W.data() + t * Dk;
      for (int64_t j = 0; j < Dv; ++j) u[j] = bet[t] * V[t * Dv + j];
      for (int64_t i = 0; i < Dk; ++i) w[i] = bet[t] * gam[t] * K[t * Dk + i];
      for (int64_t j = 0; j < t; ++j) {
        const A l = L[t * n + j];
        const A* uj = U.data() + j * Dv;
        const A* wj = W.data() + j * Dk;
        for (int64_t c = 0; c < Dv; ++c) u[c] -= l * uj[c];
        for (int64_t c = 0; c < Dk; ++c) w[c] -= l * wj[c];
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < Dk; ++i) {
        QG[t * Dk + i] = gam[t] * Q[t * Dk + i];
        Ke[t * Dk + i] = e[t] * K[t * Dk + i];
      }
    }
  }

  // D = U - W S0; O = (gam q) S0 + P D; S0 becomes the chunk's last state.
  void run(A* O, A* S) {
    const int64_t Dk = d.Dk, Dv = d.Dv;
    mm(D.data(), W.data(), S, n, Dk, Dv, false);
    for (int64_t x = 0; x < n * Dv; ++x) D[x] = U[x] - D[x];
    mm(O, QG.data(), S, n, Dk, Dv, false);
    mm(O, P.data(), D.data(), n, n, Dv, true);
    const A last = gam[n - 1];
    for (int64_t x = 0; x < Dk * Dv; ++x) S[x] *= last;
    mm_tn(S, Ke.data(), D.data(), Dk, n, Dv, true);
  }
};

}  // namespace

void gated_delta_forward(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt) {
  const DeltaDims d = check_gated_delta(q, k, v, g, beta, opt, "gated_delta_forward");
  check_same_shape_as(out, v, "out", "v", "gated_delta_forward");
  check_same_dtype_as(out, v, "out", "v", "gated_delta_forward");
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    parallel_for(d.B * d.Hv, 1, [&](int64_t begin, int64_t end) {
      Chunk<T> c(d);
      std::vector<A> S(static_cast<size_t>(d.Dk * d.Dv)),
          O(static_cast<size_t>(kDeltaChunk * d.Dv));
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / d.Hv, h = bh % d.Hv;
        for (const auto& [s, e] : documents(opt, b, d.T)) {
          std::fill(S.begin(), S.end(), A(0));
          for (int64_t t0 = s; t0 < e; t0 += kDeltaChunk) {
            const int64_t n = std::min(kDeltaChunk, e - t0);
            c.prepare(q, k, v, g, beta, b, h, t0, n);
            c.run(O.data(), S.data());
            for (int64_t t = 0; t < n; ++t) {
              T* o = out.data<T>() + ((b * d.T + t0 + t) * d.Hv + h) * d.Dv;
              for (int64_t j = 0; j < d.Dv; ++j) o[j] = store<T>(O[size_t(t * d.Dv + j)]);
            }
          }
        }
      }
    });
  });
}

namespace {

// One value head's gradients through one chunk (prepared, its D computed
// from S0), from dO and dS, the gradient of its last state. Adds into dq_acc
// and dk_acc (the chunk's rows), writes the chunk's dv, dg and dbeta, and
// leaves dS holding the gradient of S0.
template <class T>
struct ChunkGrad {
  using A = acc_t<T>;
  const DeltaDims& d;
  std::vector<A> dD, nD, dS0, Dt, dP, dQK, dE, S0t, dOS, dQ, dK, dKe, dSt, dU, dW, Ut, Wt, dL, cL,
      dG, dgam, de;

  explicit ChunkGrad(const DeltaDims& dims) : d(dims) {
    const size_t C = size_t(kDeltaChunk), Dk = size_t(d.Dk), Dv = size_t(d.Dv);
    for (auto* m : {&dD, &nD, &dU, &Dt, &Ut}) m->resize(C * Dv);
    for (auto* m : {&dOS, &dQ, &dK, &dKe, &dW, &Wt}) m->resize(C * Dk);
    for (auto* m : {&dS0, &S0t, &dSt}) m->resize(Dk * Dv);
    for (auto* m : {&dP, &dQK, &dE, &dL, &cL}) m->resize(C * C);
    for (auto* m : {&dG, &dgam, &de}) m->resize(C);
  }

  void run(const Chunk<T>& c, const A* S0, const A* dO, A* dS, A* dq_acc, A* dk_acc, T* dv, A* dg,
           A* dbeta) {
    const int64_t n = c.n, Dk = d.Dk, Dv = d.Dv;
    // dD = P^T dO + (e k) dS
    mm_tn(dD.data(), c.P.data(), dO, n, n, Dv, false);
    mm(dD.data(), c.Ke.data(), dS, n, Dk, Dv, true);
    for (int64_t x = 0; x < n * Dv; ++x) nD[x] = -dD[x];
    // dS0 = (gam q)^T dO + gam_last dS - W^T dD
    mm_tn(dS0.data(), c.QG.data(), dO, Dk, n, Dv, false);
    const A last = c.gam[n - 1];
    A dgam_last = 0;
    for (int64_t x = 0; x < Dk * Dv; ++x) dS0[x] += last * dS[x], dgam_last += S0[x] * dS[x];
    mm_tn(dS0.data(), c.W.data(), nD.data(), Dk, n, Dv, true);
    // P = (q k^T o E) masked: dP = dO D^T there.
    transpose(Dt.data(), c.D.data(), n, Dv);
    mm(dP.data(), dO, Dt.data(), n, Dv, n, false);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t x = t * n + j;
        dQK[x] = dP[x] * c.E[x];  // E is 0 above the diagonal
        dE[x] = j <= t ? dP[x] * c.QK[x] : A(0);
      }
    }
    // dq = dQK k + gam (dO S0^T); d gam from the (gam q) S0 term
    transpose(S0t.data(), S0, Dk, Dv);
    mm(dOS.data(), dO, S0t.data(), n, Dv, Dk, false);
    mm(dQ.data(), dQK.data(), c.K.data(), n, n, Dk, false);
    for (int64_t t = 0; t < n; ++t) {
      dgam[t] = dot(dOS.data() + t * Dk, c.Q.data() + t * Dk, Dk);
      for (int64_t i = 0; i < Dk; ++i) dQ[t * Dk + i] += c.gam[t] * dOS[t * Dk + i];
    }
    // dk = dQK^T q + e (D dS^T) + ... (below)
    mm_tn(dK.data(), dQK.data(), c.Q.data(), n, n, Dk, false);
    transpose(dSt.data(), dS, Dk, Dv);
    mm(dKe.data(), c.D.data(), dSt.data(), n, Dv, Dk, false);
    for (int64_t t = 0; t < n; ++t) {
      de[t] = dot(dKe.data() + t * Dk, c.K.data() + t * Dk, Dk);
      for (int64_t i = 0; i < Dk; ++i) dK[t * Dk + i] += c.e[t] * dKe[t * Dk + i];
    }
    // D = U - W S0: dU = dD, dW = -dD S0^T; then through (I + L)^-1 by back
    // substitution: dY[t] = dX[t] - sum over i > t of L[i][t] dY[i].
    std::copy(dD.begin(), dD.begin() + n * Dv, dU.begin());
    mm(dW.data(), nD.data(), S0t.data(), n, Dv, Dk, false);
    for (int64_t t = n - 1; t >= 0; --t) {
      A* du = dU.data() + t * Dv;
      A* dw = dW.data() + t * Dk;
      for (int64_t i = t + 1; i < n; ++i) {
        const A l = c.L[i * n + t];
        const A* dui = dU.data() + i * Dv;
        const A* dwi = dW.data() + i * Dk;
        for (int64_t j = 0; j < Dv; ++j) du[j] -= l * dui[j];
        for (int64_t j = 0; j < Dk; ++j) dw[j] -= l * dwi[j];
      }
    }
    // dL = -(dY [U | W]^T), strictly lower.
    transpose(Ut.data(), c.U.data(), n, Dv);
    transpose(Wt.data(), c.W.data(), n, Dk);
    mm(dL.data(), dU.data(), Ut.data(), n, Dv, n, false);
    mm(dL.data(), dW.data(), Wt.data(), n, Dk, n, true);
    for (int64_t t = 0; t < n; ++t) {
      // [beta v | beta gam k]
      const A* dut = dU.data() + t * Dv;
      const A* dwt = dW.data() + t * Dk;
      const A dwk = dot(dwt, c.K.data() + t * Dk, Dk);
      A db = dot(dut, c.V.data() + t * Dv, Dv) + c.gam[t] * dwk;
      dgam[t] += c.bet[t] * dwk;
      T* dvt = dv + t * Dv;
      for (int64_t j = 0; j < Dv; ++j) dvt[j] = store<T>(c.bet[t] * dut[j]);
      for (int64_t i = 0; i < Dk; ++i) dK[t * Dk + i] += c.bet[t] * c.gam[t] * dwt[i];
      // L[t][j] = beta_t E[t][j] (k_t . k_j)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t x = t * n + j;
        const A dl = j < t ? -dL[x] : A(0);
        cL[x] = dl * c.bet[t] * c.E[x];
        db += dl * c.E[x] * c.KK[x];
        dE[x] += dl * c.bet[t] * c.KK[x];
      }
      dbeta[t] = db;
    }
    mm(dK.data(), cL.data(), c.K.data(), n, n, Dk, true);
    mm_tn(dK.data(), cL.data(), c.K.data(), n, n, Dk, true);
    // Back to G (E, gam and e are exps of its differences), then to g.
    std::fill(dG.begin(), dG.begin() + n, A(0));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j <= t; ++j) {
        const A x = dE[t * n + j] * c.E[t * n + j];
        dG[t] += x;
        dG[j] -= x;
      }
      dG[t] += dgam[t] * c.gam[t] - de[t] * c.e[t];
      dG[n - 1] += de[t] * c.e[t];
    }
    dG[n - 1] += dgam_last * last;
    A suffix = 0;
    for (int64_t t = n - 1; t >= 0; --t) suffix += dG[t], dg[t] = suffix;
    for (int64_t x = 0; x < n * Dk; ++x) dq_acc[x] += dQ[x], dk_acc[x] += dK[x];
    std::copy(dS0.begin(), dS0.end(), dS);
  }
};

}  // namespace

void gated_delta_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                          const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt) {
  const char* op = "gated_delta_backward";
  const DeltaDims d = check_gated_delta(q, k, v, g, beta, opt, op);
  check_gated_delta_grads(dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, op);
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const int64_t Dk = d.Dk, Dv = d.Dv, SS = Dk * Dv;
    // One task per (b, q/k head): its value heads add into dq and dk.
    parallel_for(d.B * d.Hk, 1, [&](int64_t begin, int64_t end) {
      Chunk<T> c(d);
      ChunkGrad<T> cg(d);
      std::vector<A> S(static_cast<size_t>(SS)), O(static_cast<size_t>(kDeltaChunk * Dv)),
          dO(static_cast<size_t>(kDeltaChunk * Dv));
      std::vector<A> dS(static_cast<size_t>(SS)), dq_acc(static_cast<size_t>(d.T * Dk)),
          dk_acc(static_cast<size_t>(d.T * Dk));
      std::vector<A> states;  // each chunk's S0, in order
      std::vector<A> dg_rows(static_cast<size_t>(kDeltaChunk)),
          db_rows(static_cast<size_t>(kDeltaChunk));
      std::vector<T> dv_out(static_cast<size_t>(kDeltaChunk * Dv));
      for (int64_t bk = begin; bk < end; ++bk) {
        const int64_t b = bk / d.Hk, hk = bk % d.Hk;
        const auto docs = documents(opt, b, d.T);
        std::fill(dq_acc.begin(), dq_acc.end(), A(0));
        std::fill(dk_acc.begin(), dk_acc.end(), A(0));
        for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h) {
          // Forward once more, keeping the state each chunk starts from.
          std::vector<int64_t> starts;  // each chunk's first token
          states.clear();
          for (const auto& [s, e] : docs) {
            std::fill(S.begin(), S.end(), A(0));
            for (int64_t t0 = s; t0 < e; t0 += kDeltaChunk) {
              starts.push_back(t0);
              states.insert(states.end(), S.begin(), S.end());
              c.prepare(q, k, v, g, beta, b, h, t0, std::min(kDeltaChunk, e - t0));
              c.run(O.data(), S.data());
            }
          }
          // In reverse, dS restarting from zero at each document's end.
          int64_t doc = int64_t(docs.size()) - 1;
          std::fill(dS.begin(), dS.end(), A(0));
          for (int64_t ci = int64_t(starts.size()) - 1; ci >= 0; --ci) {
            const int64_t t0 = starts[size_t(ci)];
            const int64_t e = docs[size_t(doc)].second, n = std::min(kDeltaChunk, e - t0);
            c.prepare(q, k, v, g, beta, b, h, t0, n);
            std::copy(states.begin() + ci * SS, states.begin() + (ci + 1) * SS, S.begin());
            c.run(O.data(), S.data());  // D from S0 (S is then the chunk's last state)
            for (int64_t t = 0; t < n; ++t) {
              const T* src = dout.data<T>() + ((b * d.T + t0 + t) * d.Hv + h) * Dv;
              for (int64_t j = 0; j < Dv; ++j) dO[size_t(t * Dv + j)] = load(src[j]);
            }
            cg.run(c, states.data() + ci * SS, dO.data(), dS.data(), dq_acc.data() + t0 * Dk,
                   dk_acc.data() + t0 * Dk, dv_out.data(), dg_rows.data(), db_rows.data());
            for (int64_t t = 0; t < n; ++t) {
              const int64_t bt = b * d.T + t0 + t;
              std::copy(dv_out.begin() + t * Dv, dv_out.begin() + (t + 1) * Dv,
                        dv.data<T>() + (bt * d.Hv + h) * Dv);
              dg.data<A>()[bt * d.Hv + h] = dg_rows[size_t(t)];
              dbeta.data<A>()[bt * d.Hv + h] = db_rows[size_t(t)];
            }
            if (t0 == docs[size_t(doc)].first) {  // nothing flows past a document's start
              std::fill(dS.begin(), dS.end(), A(0));
              --doc;
            }
          }
        }
        for (int64_t t = 0; t < d.T; ++t) {
          const int64_t at = ((b * d.T + t) * d.Hk + hk) * Dk;
          for (int64_t i = 0; i < Dk; ++i) {
            dq.data<T>()[at + i] = store<T>(dq_acc[size_t(t * Dk + i)]);
            dk.data<T>()[at + i] = store<T>(dk_acc[size_t(t * Dk + i)]);
          }
        }
      }
    });
  });
}

}  // namespace tiermoe::cpu
