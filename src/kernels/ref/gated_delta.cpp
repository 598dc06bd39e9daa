// The gated delta rule and the l2 norm before it, plainly: one (b, h) at a
// time, token by token (kernels/gated_delta.h).
#include "tiermoe/kernels/gated_delta.h"

#include <cmath>
#include <vector>

#include "../gated_delta_check.h"
#include "../nn_common.h"

namespace tiermoe::ref {

using namespace nn_detail;
using detail::str_of;

namespace {

// One step's forward from the state before its decay (S_prev [Dk, Dv]):
// the decayed state S1, the prediction m and the delta d; S2 = S1 + k d^T.
template <class A>
struct Step {
  std::vector<A> S1, m, d;
  void run(const std::vector<A>& S_prev, const A* k, const A* v, A g, A beta, int64_t Dk,
           int64_t Dv) {
    const A a = std::exp(g);
    S1.resize(S_prev.size());
    for (size_t i = 0; i < S_prev.size(); ++i) S1[i] = a * S_prev[i];
    m.assign(size_t(Dv), A(0));
    for (int64_t i = 0; i < Dk; ++i) {
      for (int64_t j = 0; j < Dv; ++j) m[j] += S1[i * Dv + j] * k[i];
    }
    d.resize(size_t(Dv));
    for (int64_t j = 0; j < Dv; ++j) d[j] = beta * (v[j] - m[j]);
  }
};

template <class T>
std::vector<acc_t<T>> row(const Tensor& x, int64_t offset, int64_t n) {
  std::vector<acc_t<T>> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = load(x.data<T>()[offset + i]);
  return out;
}

}  // namespace

void gated_delta_forward(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt) {
  const DeltaDims d = check_gated_delta_forward(out, q, k, v, g, beta, opt);
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const int64_t Dk = d.Dk, Dv = d.Dv;
    std::vector<A> S(size_t(Dk * Dv));
    Step<A> step;
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t h = 0; h < d.Hv; ++h) {
        const int64_t hk = h / d.group();
        for (int64_t t = 0; t < d.T; ++t) {
          if (starts_document(opt, b, t, d.T)) std::fill(S.begin(), S.end(), A(0));
          const int64_t bt = b * d.T + t;
          const auto qt = row<T>(q, (bt * d.Hk + hk) * Dk, Dk);
          const auto kt = row<T>(k, (bt * d.Hk + hk) * Dk, Dk);
          const auto vt = row<T>(v, (bt * d.Hv + h) * Dv, Dv);
          step.run(S, kt.data(), vt.data(), g.data<A>()[bt * d.Hv + h],
                   beta.data<A>()[bt * d.Hv + h], Dk, Dv);
          for (int64_t i = 0; i < Dk; ++i) {
            for (int64_t j = 0; j < Dv; ++j)
              S[i * Dv + j] = step.S1[i * Dv + j] + kt[i] * step.d[j];
          }
          T* o = out.data<T>() + (bt * d.Hv + h) * Dv;
          for (int64_t j = 0; j < Dv; ++j) {
            A acc = 0;
            for (int64_t i = 0; i < Dk; ++i) acc += S[i * Dv + j] * qt[i];
            o[j] = store<T>(acc);
          }
        }
      }
    }
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
    const int64_t Dk = d.Dk, Dv = d.Dv, T_ = d.T;
    // dq and dk sum over a group's value heads: held in A until rounded.
    std::vector<A> dq_acc(size_t(q.numel()), A(0)), dk_acc(size_t(k.numel()), A(0));
    // The state before each step's decay.
    std::vector<std::vector<A>> states(static_cast<size_t>(T_));
    std::vector<A> S(size_t(Dk * Dv)), dS(size_t(Dk * Dv));
    std::vector<A> dd(static_cast<size_t>(Dv)), dm(static_cast<size_t>(Dv));
    Step<A> step;
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t h = 0; h < d.Hv; ++h) {
        const int64_t hk = h / d.group();
        auto at = [&](int64_t t) { return b * T_ + t; };
        for (int64_t t = 0; t < T_; ++t) {  // the states again
          if (starts_document(opt, b, t, T_)) std::fill(S.begin(), S.end(), A(0));
          states[size_t(t)] = S;
          const int64_t bt = at(t);
          const auto kt = row<T>(k, (bt * d.Hk + hk) * Dk, Dk);
          const auto vt = row<T>(v, (bt * d.Hv + h) * Dv, Dv);
          step.run(S, kt.data(), vt.data(), g.data<A>()[bt * d.Hv + h],
                   beta.data<A>()[bt * d.Hv + h], Dk, Dv);
          for (int64_t i = 0; i < Dk; ++i) {
            for (int64_t j = 0; j < Dv; ++j)
              S[i * Dv + j] = step.S1[i * Dv + j] + kt[i] * step.d[j];
          }
        }
        std::fill(dS.begin(), dS.end(), A(0));
        for (int64_t t = T_ - 1; t >= 0; --t) {
          const int64_t bt = at(t);
          const int64_t qk_at = (bt * d.Hk + hk) * Dk, v_at = (bt * d.Hv + h) * Dv;
          const auto qt = row<T>(q, qk_at, Dk);
          const auto kt = row<T>(k, qk_at, Dk);
          const auto vt = row<T>(v, v_at, Dv);
          const auto dot = row<T>(dout, v_at, Dv);
          const A gt = g.data<A>()[bt * d.Hv + h], bet = beta.data<A>()[bt * d.Hv + h];
          step.run(states[size_t(t)], kt.data(), vt.data(), gt, bet, Dk, Dv);
          // o = S2^T q: dS2 += q do^T, dq = S2 do.
          for (int64_t i = 0; i < Dk; ++i) {
            A acc = 0;
            for (int64_t j = 0; j < Dv; ++j) {
              const A s2 = step.S1[i * Dv + j] + kt[i] * step.d[j];
              acc += s2 * dot[j];
              dS[i * Dv + j] += qt[i] * dot[j];
            }
            dq_acc[size_t(qk_at + i)] += acc;
          }
          // S2 = S1 + k d^T: dd = dS2^T k, dk += dS2 d.
          std::fill(dd.begin(), dd.end(), A(0));
          for (int64_t i = 0; i < Dk; ++i) {
            A acc = 0;
            for (int64_t j = 0; j < Dv; ++j) {
              dd[j] += dS[i * Dv + j] * kt[i];
              acc += dS[i * Dv + j] * step.d[j];
            }
            dk_acc[size_t(qk_at + i)] += acc;
          }
          // d = beta (v - m).
          A db = 0;
          for (int64_t j = 0; j < Dv; ++j) {
            dv.data<T>()[v_at + j] = store<T>(bet * dd[j]);
            db += (vt[j] - step.m[j]) * dd[j];
            dm[j] = -bet * dd[j];
          }
          dbeta.data<A>()[bt * d.Hv + h] = db;
          // m = S1^T k: dS1 = dS2 + k dm^T, dk += S1 dm.
          A dgt = 0;
          for (int64_t i = 0; i < Dk; ++i) {
            A acc = 0;
            for (int64_t j = 0; j < Dv; ++j) {
              acc += step.S1[i * Dv + j] * dm[j];
              dS[i * Dv + j] += kt[i] * dm[j];
              dgt += step.S1[i * Dv + j] * dS[i * Dv + j];  // S1 = exp(g) S_prev
            }
            dk_acc[size_t(qk_at + i)] += acc;
          }
          dg.data<A>()[bt * d.Hv + h] = dgt;
          const A a = starts_document(opt, b, t, T_) ? A(0) : std::exp(gt);
          for (A& x : dS) x *= a;
        }
      }
    }
    for (int64_t i = 0; i < q.numel(); ++i) {
      dq.data<T>()[i] = store<T>(dq_acc[size_t(i)]);
      dk.data<T>()[i] = store<T>(dk_acc[size_t(i)]);
    }
  });
}

namespace {

void check_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                 std::string_view op) {
  check_rank(a, 3, "a", op, "a is [B, T, Hv]");
  check_same_shape_as(b, a, "b", "a", op);
  check_same_dtype_as(b, a, "b", "a", op);
  for (const auto& [t, name] : {std::pair{&A_log, "A_log"}, std::pair{&dt_bias, "dt_bias"}}) {
    check_shape_is(*t, {a.size(2)}, name, op);
    check_same_dtype_as(*t, a, name, "a", op);
  }
}

// One element's gates: x = a + dt_bias, softplus(x) (torch's: x itself past
// its threshold 20), exp(A_log), and beta rounded to b's dtype.
template <class T>
struct Gates {
  using A = acc_t<T>;
  A x, softplus, decay, beta;
  Gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, int64_t i,
        int64_t h)
      : x(load(a.data<T>()[i]) + load(dt_bias.data<T>()[h])),
        softplus(x > A(20) ? x : std::log1p(std::exp(x))),
        decay(std::exp(load(A_log.data<T>()[h]))),
        beta(load(store<T>(A(1) / (A(1) + std::exp(-load(b.data<T>()[i])))))) {}
  A g() const { return -decay * softplus; }
  A dsoftplus() const { return x > A(20) ? A(1) : A(1) / (A(1) + std::exp(-x)); }
};

}  // namespace

void gated_delta_gates_forward(Tensor& g, Tensor& beta, const Tensor& a, const Tensor& b,
                               const Tensor& A_log, const Tensor& dt_bias) {
  const char* op = "gated_delta_gates_forward";
  check_gates(a, b, A_log, dt_bias, op);
  for (const auto& [t, name] : {std::pair{&g, "g"}, std::pair{&beta, "beta"}}) {
    check_shape_is(*t, a.shape(), name, op);
    check_dtype_is(*t, acc_dtype(a.dtype()), name, op, "the rule reads them in f32 (f64 in f64)");
  }
  const int64_t H = a.size(2);
  visit_dtype(a.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const Gates<T> e(a, b, A_log, dt_bias, i, i % H);
      g.data<A>()[i] = e.g();
      beta.data<A>()[i] = e.beta;
    }
  });
}

void gated_delta_gates_backward(Tensor& da, Tensor& db, Tensor& dA_log, Tensor& ddt_bias,
                                const Tensor& dg, const Tensor& dbeta, const Tensor& a,
                                const Tensor& b, const Tensor& A_log, const Tensor& dt_bias) {
  const char* op = "gated_delta_gates_backward";
  check_gates(a, b, A_log, dt_bias, op);
  check_elementwise(da, "da", a, "a", op);
  check_elementwise(db, "db", b, "b", op);
  for (const auto& [t, name] : {std::pair{&dA_log, "dA_log"}, std::pair{&ddt_bias, "ddt_bias"}}) {
    if (!t->defined()) continue;
    check_shape_is(*t, {a.size(2)}, name, op);
    check_dtype_is(*t, acc_dtype(a.dtype()), name, op, "weight gradients are f32 (f64 in f64)");
  }
  const int64_t H = a.size(2);
  visit_dtype(a.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const int64_t h = i % H;
      const Gates<T> e(a, b, A_log, dt_bias, i, h);
      const A dgi = dg.data<A>()[i];
      const A dx = dgi * -e.decay * e.dsoftplus();
      da.data<T>()[i] = store<T>(dx);
      if (ddt_bias.defined()) ddt_bias.data<A>()[h] += dx;
      if (dA_log.defined()) dA_log.data<A>()[h] += dgi * e.g();
      db.data<T>()[i] = store<T>(dbeta.data<A>()[i] * e.beta * (A(1) - e.beta));
    }
  });
}

void l2norm_forward(Tensor& y, const Tensor& x, double scale, double eps) {
  check_elementwise(y, "y", x, "x", "l2norm_forward");
  const int64_t D = x.size(-1);
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    for (int64_t r = 0; r < row_count(x); ++r) {
      const T* xr = x.data<T>() + r * D;
      A sum_sq = 0;
      for (int64_t i = 0; i < D; ++i) sum_sq += load(xr[i]) * load(xr[i]);
      const A inv = A(1) / std::sqrt(sum_sq + A(eps));
      for (int64_t i = 0; i < D; ++i)
        y.data<T>()[r * D + i] = store<T>(load(xr[i]) * inv * A(scale));
    }
  });
}

void l2norm_backward(Tensor& dx, const Tensor& dy, const Tensor& x, double scale, double eps) {
  check_elementwise(dy, "dy", x, "x", "l2norm_backward");
  check_elementwise(dx, "dx", x, "x", "l2norm_backward");
  const int64_t D = x.size(-1);
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    for (int64_t r = 0; r < row_count(x); ++r) {
      const T* xr = x.data<T>() + r * D;
      const T* dyr = dy.data<T>() + r * D;
      A sum_sq = 0;
      for (int64_t i = 0; i < D; ++i) sum_sq += load(xr[i]) * load(xr[i]);
      const A inv = A(1) / std::sqrt(sum_sq + A(eps));
      A dot = 0;  // x_hat . dy
      for (int64_t i = 0; i < D; ++i) dot += load(xr[i]) * inv * load(dyr[i]);
      for (int64_t i = 0; i < D; ++i) {
        const A x_hat = load(xr[i]) * inv;
        dx.data<T>()[r * D + i] = store<T>(A(scale) * inv * (load(dyr[i]) - x_hat * dot));
      }
    }
  });
}

}  // namespace tiermoe::ref
