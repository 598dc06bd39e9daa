#include "tiermoe/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../attention_options.h"
#include "../nn_common.h"

namespace tiermoe::ref {

using namespace nn_detail;

namespace {

// Scores of query row (b, i, h) against keys j0..i (j0: its first visible
// key), rounded as HF's eager code rounds them, with the row max and the sum
// of exp(s - max), both over the head's sink logit too (the sink added last).
// s[j] for j < j0 is unused.
template <class T>
struct ScoreRow {
  std::vector<acc_t<T>> s;
  acc_t<T> max, sum;
};

template <class T>
ScoreRow<T> score_row(const Tensor& q, const Tensor& k, const AttentionDims& d, int64_t b,
                      int64_t i, int64_t h, int64_t j0, acc_t<T> sink, acc_t<T> scale) {
  using A = acc_t<T>;
  const T* qi = q.data<T>() + ((b * d.T + i) * d.Hq + h) * d.P;
  ScoreRow<T> row{std::vector<A>(static_cast<size_t>(i + 1)), A(-INFINITY), A(0)};
  for (int64_t j = j0; j <= i; ++j) {
    const T* kj = k.data<T>() + ((b * d.T + j) * d.Hkv + h / d.group()) * d.P;
    A dot = 0;
    for (int64_t p = 0; p < d.P; ++p) dot += load(qi[p]) * load(kj[p]);
    row.s[size_t(j)] = round_to<T>(round_to<T>(dot) * scale);
    row.max = std::max(row.max, row.s[size_t(j)]);
  }
  row.max = std::max(row.max, sink);
  for (int64_t j = j0; j <= i; ++j) row.sum += std::exp(row.s[size_t(j)] - row.max);
  row.sum += std::exp(sink - row.max);
  return row;
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse_BTH, const Tensor& q, const Tensor& k,
                       const Tensor& v, const AttentionOptions& opt) {
  AttentionDims d = check_attention(q, k, v, lse_BTH, "attention_forward");
  check_attention_out(out, d, q, "out", "attention_forward");
  check_attention_options(opt, d, q.dtype(), "attention_forward");
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const A scale = A(score_scale(opt, d));
    std::vector<A> o(static_cast<size_t>(d.Pv));
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t i = 0; i < d.T; ++i) {
        for (int64_t h = 0; h < d.Hq; ++h) {
          const int64_t j0 = first_key(opt, b, d.T, i);
          ScoreRow<T> row = score_row<T>(q, k, d, b, i, h, j0, sink_logit<A>(opt, h), scale);
          lse_BTH.data<A>()[(b * d.T + i) * d.Hq + h] = row.max + std::log(row.sum);
          std::fill(o.begin(), o.end(), A(0));
          for (int64_t j = j0; j <= i; ++j) {
            A p = round_to<T>(std::exp(row.s[size_t(j)] - row.max) / row.sum);
            const T* vj = v.data<T>() + ((b * d.T + j) * d.Hkv + h / d.group()) * d.Pv;
            for (int64_t c = 0; c < d.Pv; ++c) o[size_t(c)] += p * load(vj[c]);
          }
          T* oi = out.data<T>() + ((b * d.T + i) * d.Hq + h) * d.Pv;
          for (int64_t c = 0; c < d.Pv; ++c) oi[c] = store<T>(o[size_t(c)]);
        }
      }
    }
  });
}

// Recomputes each probability row from q and k (ref:: reads neither lse nor
// out: D_i is summed from p and dp), accumulates all the gradients in the
// math dtype, then rounds once.
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse_BTH,
                        const AttentionOptions& opt, bool accumulate, Tensor* dsinks_H) {
  AttentionDims d = check_attention(q, k, v, lse_BTH, "attention_backward");
  check_attention_options(opt, d, q.dtype(), "attention_backward");
  check_dsinks(dsinks_H, opt, d, q.dtype(), "attention_backward");
  check_attention_out(dout, d, q, "dout", "attention_backward");
  check_attention_out(out, d, q, "out", "attention_backward");
  check_elementwise(dq, "dq", q, "q", "attention_backward");
  check_elementwise(dk, "dk", k, "k", "attention_backward");
  check_elementwise(dv, "dv", v, "v", "attention_backward");
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const A scale = A(score_scale(opt, d));
    std::vector<A> gq(size_t(q.numel()), A(0)), gk(size_t(k.numel()), A(0)),
        gv(size_t(v.numel()), A(0)), gsink(size_t(d.Hq), A(0));
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t i = 0; i < d.T; ++i) {
        for (int64_t h = 0; h < d.Hq; ++h) {
          const int64_t j0 = first_key(opt, b, d.T, i);
          const A sink = sink_logit<A>(opt, h);
          ScoreRow<T> row = score_row<T>(q, k, d, b, i, h, j0, sink, scale);
          const int64_t qi_at = ((b * d.T + i) * d.Hq + h) * d.P;
          const T* qi = q.data<T>() + qi_at;
          const T* doi = dout.data<T>() + ((b * d.T + i) * d.Hq + h) * d.Pv;
          std::vector<A> p(size_t(i + 1)), dp(size_t(i + 1));
          A sum_p_dp = 0;
          for (int64_t j = j0; j <= i; ++j) {
            const T* vj = v.data<T>() + ((b * d.T + j) * d.Hkv + h / d.group()) * d.Pv;
            p[size_t(j)] = std::exp(row.s[size_t(j)] - row.max) / row.sum;
            A dot = 0;
            for (int64_t c = 0; c < d.Pv; ++c) dot += load(doi[c]) * load(vj[c]);
            dp[size_t(j)] = dot;
            sum_p_dp += p[size_t(j)] * dot;
          }
          // The sink column: dp = 0 (no value), so ds_sink = -p_sink D.
          gsink[size_t(h)] -= std::exp(sink - row.max) / row.sum * sum_p_dp;
          for (int64_t j = j0; j <= i; ++j) {
            int64_t kj_at = ((b * d.T + j) * d.Hkv + h / d.group()) * d.P;
            const T* kj = k.data<T>() + kj_at;
            A ds = p[size_t(j)] * (dp[size_t(j)] - sum_p_dp) * scale;
            A p_cast = round_to<T>(p[size_t(j)]);  // the forward multiplied v by this
            for (int64_t c = 0; c < d.P; ++c) {
              gq[size_t(qi_at + c)] += ds * load(kj[c]);
              gk[size_t(kj_at + c)] += ds * load(qi[c]);
            }
            const int64_t vj_at = ((b * d.T + j) * d.Hkv + h / d.group()) * d.Pv;
            for (int64_t c = 0; c < d.Pv; ++c) gv[size_t(vj_at + c)] += p_cast * load(doi[c]);
          }
        }
      }
    }
    for (int64_t n = 0; n < q.numel(); ++n) put(dq.data<T>()[n], gq[size_t(n)], accumulate);
    for (int64_t n = 0; n < k.numel(); ++n) put(dk.data<T>()[n], gk[size_t(n)], accumulate);
    for (int64_t n = 0; n < v.numel(); ++n) put(dv.data<T>()[n], gv[size_t(n)], accumulate);
    if (dsinks_H) {
      for (int64_t h = 0; h < d.Hq; ++h) dsinks_H->data<A>()[h] += gsink[size_t(h)];
    }
  });
}

}  // namespace tiermoe::ref
