#include "tiermoe/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../attention_docs.h"
#include "../nn_common.h"

namespace tiermoe::ref {

using namespace nn_detail;

namespace {

// Scores of query row (b, i, h) against keys j0..i (j0: its document's first
// token), rounded as HF's eager code rounds them, with the row max and the
// sum of exp(s - max). s[j] for j < j0 is unused.
template <class T>
struct ScoreRow {
  std::vector<acc_t<T>> s;
  acc_t<T> max, sum;
};

template <class T>
ScoreRow<T> score_row(const Tensor& q, const Tensor& k, const AttentionDims& d, int64_t b,
                      int64_t i, int64_t h, int64_t j0) {
  using A = acc_t<T>;
  const A scale = A(1.0 / std::sqrt(double(d.P)));
  const T* qi = q.data<T>() + ((b * d.T + i) * d.Hq + h) * d.P;
  ScoreRow<T> row{std::vector<A>(static_cast<size_t>(i + 1)), A(-INFINITY), A(0)};
  for (int64_t j = j0; j <= i; ++j) {
    const T* kj = k.data<T>() + ((b * d.T + j) * d.Hkv + h / d.group()) * d.P;
    A dot = 0;
    for (int64_t p = 0; p < d.P; ++p) dot += load(qi[p]) * load(kj[p]);
    row.s[size_t(j)] = round_to<T>(round_to<T>(dot) * scale);
    row.max = std::max(row.max, row.s[size_t(j)]);
  }
  for (int64_t j = j0; j <= i; ++j) row.sum += std::exp(row.s[size_t(j)] - row.max);
  return row;
}

}  // namespace

void attention_forward(Tensor& out, Tensor& lse_BTH, const Tensor& q, const Tensor& k,
                       const Tensor& v) {
  attention_forward_docs(out, lse_BTH, q, k, v, {});
}

void attention_forward_docs(Tensor& out, Tensor& lse_BTH, const Tensor& q, const Tensor& k,
                            const Tensor& v, std::span<const int32_t> doc_start_BT) {
  AttentionDims d = check_attention(q, k, v, lse_BTH, "attention_forward");
  check_elementwise(out, "out", q, "q", "attention_forward");
  check_doc_starts(doc_start_BT, d.B, d.T, "attention_forward");
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    std::vector<A> o(static_cast<size_t>(d.P));
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t i = 0; i < d.T; ++i) {
        for (int64_t h = 0; h < d.Hq; ++h) {
          const int64_t j0 = first_key(doc_start_BT, b, d.T, i);
          ScoreRow<T> row = score_row<T>(q, k, d, b, i, h, j0);
          lse_BTH.data<A>()[(b * d.T + i) * d.Hq + h] = row.max + std::log(row.sum);
          std::fill(o.begin(), o.end(), A(0));
          for (int64_t j = j0; j <= i; ++j) {
            A p = round_to<T>(std::exp(row.s[size_t(j)] - row.max) / row.sum);
            const T* vj = v.data<T>() + ((b * d.T + j) * d.Hkv + h / d.group()) * d.P;
            for (int64_t c = 0; c < d.P; ++c) o[size_t(c)] += p * load(vj[c]);
          }
          T* oi = out.data<T>() + ((b * d.T + i) * d.Hq + h) * d.P;
          for (int64_t c = 0; c < d.P; ++c) oi[c] = store<T>(o[size_t(c)]);
        }
      }
    }
  });
}

// Recomputes each probability row from q and k (ref:: reads neither lse nor
// out: D_i is summed from p and dp), accumulates all three gradients in the
// math dtype, then rounds once.
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse_BTH,
                        bool accumulate) {
  attention_backward_docs(dq, dk, dv, dout, q, k, v, out, lse_BTH, {}, accumulate);
}

void attention_backward_docs(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse_BTH, std::span<const int32_t> doc_start_BT,
                             bool accumulate) {
  AttentionDims d = check_attention(q, k, v, lse_BTH, "attention_backward");
  check_doc_starts(doc_start_BT, d.B, d.T, "attention_backward");
  check_elementwise(dout, "dout", q, "q", "attention_backward");
  check_elementwise(out, "out", q, "q", "attention_backward");
  check_elementwise(dq, "dq", q, "q", "attention_backward");
  check_elementwise(dk, "dk", k, "k", "attention_backward");
  check_elementwise(dv, "dv", v, "v", "attention_backward");
  visit_dtype(q.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const A scale = A(1.0 / std::sqrt(double(d.P)));
    std::vector<A> gq(size_t(q.numel()), A(0)), gk(size_t(k.numel()), A(0)),
        gv(size_t(v.numel()), A(0));
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t i = 0; i < d.T; ++i) {
        for (int64_t h = 0; h < d.Hq; ++h) {
          const int64_t j0 = first_key(doc_start_BT, b, d.T, i);
          ScoreRow<T> row = score_row<T>(q, k, d, b, i, h, j0);
          int64_t qi_at = ((b * d.T + i) * d.Hq + h) * d.P;
          const T* qi = q.data<T>() + qi_at;
          const T* doi = dout.data<T>() + qi_at;
          std::vector<A> p(size_t(i + 1)), dp(size_t(i + 1));
          A sum_p_dp = 0;
          for (int64_t j = j0; j <= i; ++j) {
            const T* vj = v.data<T>() + ((b * d.T + j) * d.Hkv + h / d.group()) * d.P;
            p[size_t(j)] = std::exp(row.s[size_t(j)] - row.max) / row.sum;
            A dot = 0;
            for (int64_t c = 0; c < d.P; ++c) dot += load(doi[c]) * load(vj[c]);
            dp[size_t(j)] = dot;
            sum_p_dp += p[size_t(j)] * dot;
          }
          for (int64_t j = j0; j <= i; ++j) {
            int64_t kj_at = ((b * d.T + j) * d.Hkv + h / d.group()) * d.P;
            const T* kj = k.data<T>() + kj_at;
            A ds = p[size_t(j)] * (dp[size_t(j)] - sum_p_dp) * scale;
            A p_cast = round_to<T>(p[size_t(j)]);  // the forward multiplied v by this
            for (int64_t c = 0; c < d.P; ++c) {
              gq[size_t(qi_at + c)] += ds * load(kj[c]);
              gk[size_t(kj_at + c)] += ds * load(qi[c]);
              gv[size_t(kj_at + c)] += p_cast * load(doi[c]);
            }
          }
        }
      }
    }
    for (int64_t n = 0; n < q.numel(); ++n) put(dq.data<T>()[n], gq[size_t(n)], accumulate);
    for (int64_t n = 0; n < k.numel(); ++n) put(dk.data<T>()[n], gk[size_t(n)], accumulate);
    for (int64_t n = 0; n < v.numel(); ++n) put(dv.data<T>()[n], gv[size_t(n)], accumulate);
  });
}

}  // namespace tiermoe::ref
