// The gated delta rule in chunks (kernels/gated_delta.h), as FLA's chunked
// form and transformers' torch_chunk_gated_delta_rule compute it: within a
// chunk of n <= kDeltaChunk tokens the recurrence is a handful of small
// matrix products, and only the state crosses chunks.
//
// One chunk, from the state S0 [Dk, Dv] it starts from, with G the
// cumulative sum of g over the chunk, gam_t = exp(G_t) and
// E[t][j] = exp(G_t - G_j) for j <= t:
//   L[t][j] = beta_t E[t][j] (k_t . k_j), j < t     (strictly lower)
//   [U | W] = (I + L)^-1 [beta v | beta gam k]       ((I + L)^-1 by forward substitution)
//   D       = U - W S0                               (each token's delta d_t)
//   O       = (gam q) S0 + (q k^T o E)_{j <= t} D
//   S_n     = gam_{n-1} S0 + (e k)^T D,  e_j = exp(G_{n-1} - G_j)
// which is the recurrence unrolled over the chunk (d_t = beta_t (v_t -
// exp(g_t) S_{t-1}^T k_t) solved for every t at once). Backward runs the same
// products transposed, chunk by chunk in reverse, from each chunk's S0 and D
// kept by a forward pass over the row. The products run on the process's
// GEMM; the state is f32 (f64 in f64 runs) whatever the inputs' dtype.
//
// Chunks never cross a document: each document of a packed row is chunked
// from its own first token with the state zero there, so a document's bits
// do not depend on where it sits in the row. Every (b, head) is computed by
// one task from its own inputs, so the thread count changes no bit.
#include <pmmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../gated_delta_check.h"
#include "matmul_product.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {

// Denormals read and written as zero while a task runs (MXCSR's DAZ and
// FTZ, restored after). A strong decay (-exp(A_log) softplus(.) reaches -20
// a token at Qwen3.5's initialisation) makes exp(G_t - G_j) and the state's
// old terms fall below the smallest normal float within a few tokens; the
// products would then crawl through denormals (a whole step 7x slower).
// What they are flushed from is below 1e-38 of the terms beside it.
class DenormalsAreZero {
 public:
  DenormalsAreZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // DAZ | FTZ
  ~DenormalsAreZero() { _mm_setcsr(saved_); }
  DenormalsAreZero(const DenormalsAreZero&) = delete;
  DenormalsAreZero& operator=(const DenormalsAreZero&) = delete;

 private:
  unsigned saved_;
};

// Row-major products on contiguous buffers, on the process's GEMM (the one
// every linear layer runs, kernels/cpu/matmul_product.h). C[m, n] (+)=
// op(X) op(Y): X is [m, k], or [k, m] read transposed (tx); Y [k, n], or
// [n, k] (ty).
template <class A>
void gemm(A* C, const A* X, bool tx, const A* Y, bool ty, int64_t m, int64_t k, int64_t n,
          bool accumulate) {
  constexpr DType dt = dtype_of<A>;
  Tensor c = Tensor::from_external(C, {m, n}, dt, nullptr);
  const Tensor x =
      Tensor::from_external(const_cast<A*>(X), tx ? Shape{k, m} : Shape{m, k}, dt, nullptr);
  const Tensor y =
      Tensor::from_external(const_cast<A*>(Y), ty ? Shape{n, k} : Shape{k, n}, dt, nullptr);
  product(
      c, x, y,
      {.M = m, .N = n, .K = k, .a_transposed = tx, .b_transposed = ty, .accumulate = accumulate});
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
// them before the state enters, then D and the state update. The state is
// held transposed, St [Dv, Dk], so that each product reads it as stored.
template <class T>
struct Chunk {
  using A = acc_t<T>;
  const DeltaDims& d;
  int64_t n = 0;  // tokens in this chunk
  // Tm: (I + L)^-1 (unit lower triangular); Yu, Yw: [beta v | beta gam k].
  std::vector<A> Q, K, V, G, gam, e, bet, E, KK, QK, L, Tm, Yu, Yw, U, W, D, P, QG, Ke;

  explicit Chunk(const DeltaDims& dims) : d(dims) {
    const size_t C = size_t(kDeltaChunk), Dk = size_t(d.Dk), Dv = size_t(d.Dv);
    for (auto* m : {&Q, &K, &W, &Yw, &QG, &Ke}) m->resize(C * Dk);
    for (auto* m : {&V, &U, &Yu, &D}) m->resize(C * Dv);
    for (auto* m : {&E, &KK, &QK, &L, &Tm, &P}) m->resize(C * C);
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
      bet[t] = beta.data<A>()[bt * d.Hv + h];
    }
    for (int64_t t = 0; t < n; ++t) gam[t] = exp_acc(G[t]), e[t] = exp_acc(G[n - 1] - G[t]);
    gemm(KK.data(), K.data(), false, K.data(), true, n, Dk, n, false);
    gemm(QK.data(), Q.data(), false, K.data(), true, n, Dk, n, false);
    std::fill(E.begin(), E.begin() + n * n, A(0));
    std::fill(L.begin(), L.begin() + n * n, A(0));
    std::fill(P.begin(), P.begin() + n * n, A(0));
    for (int64_t t = 0; t < n; ++t) {
      A *Et = E.data() + t * n, *Lt = L.data() + t * n, *Pt = P.data() + t * n;
      const A *KKt = KK.data() + t * n, *QKt = QK.data() + t * n;
      // exp of a sum of decays (<= 0): never overflows, as gam_t / gam_j could.
      for (int64_t j = 0; j <= t; ++j) Et[j] = exp_acc(G[t] - G[j]);
      for (int64_t j = 0; j < t; ++j) Lt[j] = bet[t] * Et[j] * KKt[j];
      for (int64_t j = 0; j <= t; ++j) Pt[j] = QKt[j] * Et[j];
    }
    // Tm = (I + L)^-1 by forward substitution: row t is e_t - sum over j < t
    // of L[t][j] Tm[j], and Tm[j] is 0 past column j.
    std::fill(Tm.begin(), Tm.begin() + n * n, A(0));
    for (int64_t t = 0; t < n; ++t) {
      A* row = Tm.data() + t * n;
      row[t] = 1;
      for (int64_t j = 0; j < t; ++j) {
        const A l = L[t * n + j];
        const A* rj = Tm.data() + j * n;
        for (int64_t c = 0; c <= j; ++c) row[c] -= l * rj[c];
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < Dv; ++j) Yu[t * Dv + j] = bet[t] * V[t * Dv + j];
      for (int64_t i = 0; i < Dk; ++i) {
        Yw[t * Dk + i] = bet[t] * gam[t] * K[t * Dk + i];
        QG[t * Dk + i] = gam[t] * Q[t * Dk + i];
        Ke[t * Dk + i] = e[t] * K[t * Dk + i];
      }
    }
    gemm(U.data(), Tm.data(), false, Yu.data(), false, n, n, Dv, false);
    gemm(W.data(), Tm.data(), false, Yw.data(), false, n, n, Dk, false);
  }

  // D = U - W S0, from St (S0 transposed).
  void delta(const A* St) {
    gemm(D.data(), W.data(), false, St, true, n, d.Dk, d.Dv, false);
    for (int64_t x = 0; x < n * d.Dv; ++x) D[x] = U[x] - D[x];
  }
  // O = (gam q) S0 + P D, after delta().
  void output(A* O, const A* St) const {
    gemm(O, QG.data(), false, St, true, n, d.Dk, d.Dv, false);
    gemm(O, P.data(), false, D.data(), false, n, n, d.Dv, true);
  }
  // St becomes the chunk's last state, after delta(): gam_last St + D^T (e k).
  void advance(A* St) const {
    const A last = gam[n - 1];
    for (int64_t x = 0; x < d.Dk * d.Dv; ++x) St[x] *= last;
    gemm(St, D.data(), true, Ke.data(), false, d.Dv, n, d.Dk, true);
  }
};

}  // namespace

void gated_delta_forward(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt) {
  const DeltaDims d = check_gated_delta_forward(out, q, k, v, g, beta, opt);
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    parallel_for(d.B * d.Hv, 1, [&](int64_t begin, int64_t end) {
      const DenormalsAreZero daz;
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
            c.delta(S.data());
            c.output(O.data(), S.data());
            c.advance(S.data());
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
// from St0), from dO and dSt, the gradient of its last state (both states
// transposed, [Dv, Dk]). Adds into dq_acc and dk_acc (the chunk's rows),
// writes the chunk's dv, dg and dbeta, and leaves dSt holding the gradient
// of St0.
template <class T>
struct ChunkGrad {
  using A = acc_t<T>;
  const DeltaDims& d;
  std::vector<A> dD, nD, dSt0, dP, dQK, dE, dOS, dQ, dK, dKe, dXu, dXw, dU, dW, dL, cL, dG, dgam,
      de;

  explicit ChunkGrad(const DeltaDims& dims) : d(dims) {
    const size_t C = size_t(kDeltaChunk), Dk = size_t(d.Dk), Dv = size_t(d.Dv);
    for (auto* m : {&dD, &nD, &dXu, &dU}) m->resize(C * Dv);
    for (auto* m : {&dOS, &dQ, &dK, &dKe, &dXw, &dW}) m->resize(C * Dk);
    dSt0.resize(Dk * Dv);
    for (auto* m : {&dP, &dQK, &dE, &dL, &cL}) m->resize(C * C);
    for (auto* m : {&dG, &dgam, &de}) m->resize(C);
  }

  void run(const Chunk<T>& c, const A* St0, const A* dO, A* dSt, A* dq_acc, A* dk_acc, T* dv, A* dg,
           A* dbeta) {
    const int64_t n = c.n, Dk = d.Dk, Dv = d.Dv;
    // dD = P^T dO + (e k) dS
    gemm(dD.data(), c.P.data(), true, dO, false, n, n, Dv, false);
    gemm(dD.data(), c.Ke.data(), false, dSt, true, n, Dk, Dv, true);
    for (int64_t x = 0; x < n * Dv; ++x) nD[x] = -dD[x];
    // dSt0 = dO^T (gam q) + gam_last dSt - dD^T W
    gemm(dSt0.data(), dO, true, c.QG.data(), false, Dv, n, Dk, false);
    const A last = c.gam[n - 1];
    A dgam_last = 0;
    for (int64_t x = 0; x < Dk * Dv; ++x) dSt0[x] += last * dSt[x], dgam_last += St0[x] * dSt[x];
    gemm(dSt0.data(), nD.data(), true, c.W.data(), false, Dv, n, Dk, true);
    // P = (q k^T o E) masked: dP = dO D^T there.
    gemm(dP.data(), dO, false, c.D.data(), true, n, Dv, n, false);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t x = t * n + j;
        dQK[x] = dP[x] * c.E[x];  // E is 0 above the diagonal
        dE[x] = j <= t ? dP[x] * c.QK[x] : A(0);
      }
    }
    // dq = dQK k + gam (dO S0^T); d gam from the (gam q) S0 term
    gemm(dOS.data(), dO, false, St0, false, n, Dv, Dk, false);
    gemm(dQ.data(), dQK.data(), false, c.K.data(), false, n, n, Dk, false);
    for (int64_t t = 0; t < n; ++t) {
      dgam[t] = dot(dOS.data() + t * Dk, c.Q.data() + t * Dk, Dk);
      for (int64_t i = 0; i < Dk; ++i) dQ[t * Dk + i] += c.gam[t] * dOS[t * Dk + i];
    }
    // dk = dQK^T q + e (D dS^T) + ... (below)
    gemm(dK.data(), dQK.data(), true, c.Q.data(), false, n, n, Dk, false);
    gemm(dKe.data(), c.D.data(), false, dSt, false, n, Dv, Dk, false);
    for (int64_t t = 0; t < n; ++t) {
      de[t] = dot(dKe.data() + t * Dk, c.K.data() + t * Dk, Dk);
      for (int64_t i = 0; i < Dk; ++i) dK[t * Dk + i] += c.e[t] * dKe[t * Dk + i];
    }
    // D = U - W S0: dU = dD, dW = -dD S0^T; then [U | W] = Tm Y: dY = Tm^T dX.
    gemm(dXw.data(), nD.data(), false, St0, false, n, Dv, Dk, false);
    gemm(dU.data(), c.Tm.data(), true, dD.data(), false, n, n, Dv, false);
    gemm(dW.data(), c.Tm.data(), true, dXw.data(), false, n, n, Dk, false);
    // dL = -(dY [U | W]^T), strictly lower (Tm = (I + L)^-1).
    gemm(dL.data(), dU.data(), false, c.U.data(), true, n, Dv, n, false);
    gemm(dL.data(), dW.data(), false, c.W.data(), true, n, Dk, n, true);
    for (int64_t t = 0; t < n; ++t) {
      // Y = [beta v | beta gam k]
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
    gemm(dK.data(), cL.data(), false, c.K.data(), false, n, n, Dk, true);
    gemm(dK.data(), cL.data(), true, c.K.data(), false, n, n, Dk, true);
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
    std::copy(dSt0.begin(), dSt0.end(), dSt);
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
      const DenormalsAreZero daz;
      // The row's chunks, prepared once by the forward pass and read again in
      // reverse (a few hundred KB each).
      std::vector<Chunk<T>> chunks;
      ChunkGrad<T> cg(d);
      std::vector<A> S(static_cast<size_t>(SS)), dO(static_cast<size_t>(kDeltaChunk * Dv));
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
          // Forward once more without the output, keeping each chunk (its D
          // included) and the state it starts from.
          std::vector<int64_t> starts;  // each chunk's first token
          states.clear();
          for (const auto& [s, e] : docs) {
            std::fill(S.begin(), S.end(), A(0));
            for (int64_t t0 = s; t0 < e; t0 += kDeltaChunk) {
              if (starts.size() == chunks.size()) chunks.emplace_back(d);
              Chunk<T>& c = chunks[starts.size()];
              starts.push_back(t0);
              states.insert(states.end(), S.begin(), S.end());
              c.prepare(q, k, v, g, beta, b, h, t0, std::min(kDeltaChunk, e - t0));
              c.delta(S.data());
              c.advance(S.data());
            }
          }

          // In reverse, dS restarting from zero at each document's end.
          int64_t doc = int64_t(docs.size()) - 1;
          std::fill(dS.begin(), dS.end(), A(0));
          for (int64_t ci = int64_t(starts.size()) - 1; ci >= 0; --ci) {
            const int64_t t0 = starts[size_t(ci)];
            const Chunk<T>& c = chunks[size_t(ci)];
            const int64_t n = c.n;
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
