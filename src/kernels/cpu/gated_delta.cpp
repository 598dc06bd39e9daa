// The gated delta rule's recurrence with ref::'s operations in ref::'s order
// (kernels/gated_delta.h): one q/k head and its value heads per task, rows
// widened once per token into reused buffers, and backward's states kept
// every kDeltaCheckpoint tokens instead of at every token.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../gated_delta_check.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {

// The working rows of one (b, value head): its token's inputs widened, the
// state and the step's intermediates.
template <class T>
struct HeadRun {
  using A = acc_t<T>;
  const DeltaDims& d;
  const GatedDeltaOptions& opt;
  std::vector<A> q, k, v, S, S1, m, delta;

  HeadRun(const DeltaDims& dims, const GatedDeltaOptions& o)
      : d(dims),
        opt(o),
        q(size_t(d.Dk)),
        k(size_t(d.Dk)),
        v(size_t(d.Dv)),
        S(size_t(d.Dk * d.Dv)),
        S1(S.size()),
        m(size_t(d.Dv)),
        delta(size_t(d.Dv)) {}

  static void widen(std::vector<A>& dst, const Tensor& src, int64_t at) {
    const T* s = src.data<T>() + at;
    for (size_t i = 0; i < dst.size(); ++i) dst[i] = load(s[i]);
  }
  // Token t of row b, value head h (q/k head hk): reads q, k, v; S (the state
  // before the step's decay) -> S1, m, delta; leaves S unchanged.
  void step(const Tensor& qt, const Tensor& kt, const Tensor& vt, A g, A beta, int64_t qk_at,
            int64_t v_at) {
    widen(q, qt, qk_at);
    widen(k, kt, qk_at);
    widen(v, vt, v_at);
    const A a = std::exp(g);
    for (size_t i = 0; i < S.size(); ++i) S1[i] = a * S[i];
    std::fill(m.begin(), m.end(), A(0));
    for (int64_t i = 0; i < d.Dk; ++i) {
      for (int64_t j = 0; j < d.Dv; ++j) m[j] += S1[i * d.Dv + j] * k[i];
    }
    for (int64_t j = 0; j < d.Dv; ++j) delta[j] = beta * (v[j] - m[j]);
  }
  // S = S1 + k delta^T.
  void write() {
    for (int64_t i = 0; i < d.Dk; ++i) {
      for (int64_t j = 0; j < d.Dv; ++j) S[i * d.Dv + j] = S1[i * d.Dv + j] + k[i] * delta[j];
    }
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
      HeadRun<T> run(d, opt);
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / d.Hv, h = bh % d.Hv, hk = h / d.group();
        for (int64_t t = 0; t < d.T; ++t) {
          if (starts_document(opt, b, t, d.T)) std::fill(run.S.begin(), run.S.end(), A(0));
          const int64_t bt = b * d.T + t, v_at = (bt * d.Hv + h) * d.Dv;
          run.step(q, k, v, g.data<A>()[bt * d.Hv + h], beta.data<A>()[bt * d.Hv + h],
                   (bt * d.Hk + hk) * d.Dk, v_at);
          run.write();
          // o = S^T q, row by row of S (each o_j still sums i in order).
          std::fill(run.m.begin(), run.m.end(), A(0));
          for (int64_t i = 0; i < d.Dk; ++i) {
            for (int64_t j = 0; j < d.Dv; ++j) run.m[j] += run.S[i * d.Dv + j] * run.q[i];
          }
          T* o = out.data<T>() + v_at;
          for (int64_t j = 0; j < d.Dv; ++j) o[j] = store<T>(run.m[j]);
        }
      }
    });
  });
}

void gated_delta_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                          const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt) {
  const char* op = "gated_delta_backward";
  const DeltaDims d = check_gated_delta(q, k, v, g, beta, opt, op);
  check_gated_delta_grads(dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta, op);
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const int64_t Dk = d.Dk, Dv = d.Dv, T_ = d.T, C = kDeltaCheckpoint;
    const int64_t spans = (T_ + C - 1) / C, SS = Dk * Dv;
    // One task per (b, q/k head): its value heads add into dq and dk in
    // increasing head order, as ref:: does.
    parallel_for(d.B * d.Hk, 1, [&](int64_t begin, int64_t end) {
      HeadRun<T> run(d, opt);
      auto zeros = [](int64_t n) { return std::vector<A>(static_cast<size_t>(n)); };
      std::vector<A> checkpoints = zeros(spans * SS), span_states = zeros(C * SS);
      std::vector<A> dS = zeros(SS), dd = zeros(Dv), dm = zeros(Dv), dO = zeros(Dv);
      std::vector<A> dq_acc = zeros(T_ * Dk), dk_acc = zeros(T_ * Dk);
      for (int64_t bk = begin; bk < end; ++bk) {
        const int64_t b = bk / d.Hk, hk = bk % d.Hk;
        std::fill(dq_acc.begin(), dq_acc.end(), A(0));
        std::fill(dk_acc.begin(), dk_acc.end(), A(0));
        for (int64_t h = hk * d.group(); h < (hk + 1) * d.group(); ++h) {
          auto qk_at = [&](int64_t t) { return ((b * T_ + t) * d.Hk + hk) * Dk; };
          auto v_at = [&](int64_t t) { return ((b * T_ + t) * d.Hv + h) * Dv; };
          auto gate = [&](const Tensor& x, int64_t t) {
            return x.data<A>()[(b * T_ + t) * d.Hv + h];
          };
          // The state before each span's first step (after its document reset).
          std::fill(run.S.begin(), run.S.end(), A(0));
          for (int64_t t = 0; t < T_; ++t) {
            if (starts_document(opt, b, t, T_)) std::fill(run.S.begin(), run.S.end(), A(0));
            if (t % C == 0) std::copy(run.S.begin(), run.S.end(), checkpoints.begin() + t / C * SS);
            run.step(q, k, v, gate(g, t), gate(beta, t), qk_at(t), v_at(t));
            run.write();
          }
          std::fill(dS.begin(), dS.end(), A(0));
          for (int64_t s = spans - 1; s >= 0; --s) {
            const int64_t t0 = s * C, t1 = std::min(T_, t0 + C);
            // The span's states before each step's decay, again.
            std::copy(checkpoints.begin() + s * SS, checkpoints.begin() + (s + 1) * SS,
                      run.S.begin());
            for (int64_t t = t0; t < t1; ++t) {
              if (starts_document(opt, b, t, T_)) std::fill(run.S.begin(), run.S.end(), A(0));
              std::copy(run.S.begin(), run.S.end(), span_states.begin() + (t - t0) * SS);
              run.step(q, k, v, gate(g, t), gate(beta, t), qk_at(t), v_at(t));
              run.write();
            }
            for (int64_t t = t1 - 1; t >= t0; --t) {
              std::copy(span_states.begin() + (t - t0) * SS,
                        span_states.begin() + (t - t0 + 1) * SS, run.S.begin());
              const A gt = gate(g, t), bet = gate(beta, t);
              run.step(q, k, v, gt, bet, qk_at(t), v_at(t));
              HeadRun<T>::widen(dO, dout, v_at(t));
              A* dq_t = dq_acc.data() + t * Dk;
              A* dk_t = dk_acc.data() + t * Dk;
              for (int64_t i = 0; i < Dk; ++i) {  // o = S2^T q
                A acc = 0;
                for (int64_t j = 0; j < Dv; ++j) {
                  const A s2 = run.S1[i * Dv + j] + run.k[i] * run.delta[j];
                  acc += s2 * dO[j];
                  dS[i * Dv + j] += run.q[i] * dO[j];
                }
                dq_t[i] += acc;
              }
              std::fill(dd.begin(), dd.end(), A(0));
              for (int64_t i = 0; i < Dk; ++i) {  // S2 = S1 + k d^T
                A acc = 0;
                for (int64_t j = 0; j < Dv; ++j) {
                  dd[j] += dS[i * Dv + j] * run.k[i];
                  acc += dS[i * Dv + j] * run.delta[j];
                }
                dk_t[i] += acc;
              }
              A db = 0;  // d = beta (v - m)
              for (int64_t j = 0; j < Dv; ++j) {
                dv.data<T>()[v_at(t) + j] = store<T>(bet * dd[j]);
                db += (run.v[j] - run.m[j]) * dd[j];
                dm[j] = -bet * dd[j];
              }
              dbeta.data<A>()[(b * T_ + t) * d.Hv + h] = db;
              A dgt = 0;  // m = S1^T k
              for (int64_t i = 0; i < Dk; ++i) {
                A acc = 0;
                for (int64_t j = 0; j < Dv; ++j) {
                  acc += run.S1[i * Dv + j] * dm[j];
                  dS[i * Dv + j] += run.k[i] * dm[j];
                  dgt += run.S1[i * Dv + j] * dS[i * Dv + j];
                }
                dk_t[i] += acc;
              }
              dg.data<A>()[(b * T_ + t) * d.Hv + h] = dgt;
              const A a = starts_document(opt, b, t, T_) ? A(0) : std::exp(gt);
              for (A& x : dS) x *= a;
            }
          }
        }
        for (int64_t t = 0; t < T_; ++t) {
          const int64_t at = ((b * T_ + t) * d.Hk + hk) * Dk;
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
