#include "tiermoe/moe/expert_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

// The clamped GLU's element math, shared with the grouped kernels' epilogue
// (kernels/cpu/grouped_matmul.cpp) so the two give the same bits.
#include "../kernels/nn_common.h"

namespace tiermoe {

namespace {

// Score-dtype tensors (f32 or f64) read as the acc type of the rows they scale.
template <class A>
A score_at(const Tensor& s, int64_t m) {
  if (s.dtype() == DType::f64) return A(s.data<double>()[m]);
  return A(s.data<float>()[m]);
}

template <class A>
void add_score(Tensor& s, int64_t m, A v) {
  if (s.dtype() == DType::f64) s.data<double>()[m] += double(v);
  else s.data<float>()[m] += float(v);
}

// Accumulating acc-dtype buffers (grads): f32 for bf16 runs.
template <class A>
A* acc_data(Tensor& t) {
  return t.data<A>();
}

void check_rows_cols(const Tensor& t, int64_t rows, int64_t cols, std::string_view name) {
  check_shape(t, {rows, cols}, name);
}

}  // namespace

void gpt_oss_glu_forward(Tensor& a_MF, const Tensor& h_M2F, const GptOssActivation& act) {
  const int64_t M = h_M2F.size(0), F = h_M2F.size(1) / 2;
  check_rows_cols(a_MF, M, F, "gpt_oss_glu_forward: a_MF");
  check_same_dtype(a_MF, h_M2F, "a_MF", "h_M2F");
  visit_dtype(a_MF.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const A alpha = A(act.alpha), limit = A(act.limit);
    const T* h = h_M2F.data<T>();
    T* a = a_MF.data<T>();
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t f = 0; f < F; ++f) {
        a[m * F + f] = store<T>(nn_detail::gpt_oss_glu(
            load<T>(h[m * 2 * F + 2 * f]), load<T>(h[m * 2 * F + 2 * f + 1]), alpha, limit));
      }
    }
  });
}

void gpt_oss_glu_backward(Tensor& dh_M2F, const Tensor& da_MF, const Tensor& h_M2F,
                          const GptOssActivation& act) {
  const int64_t M = h_M2F.size(0), F = h_M2F.size(1) / 2;
  check_rows_cols(da_MF, M, F, "gpt_oss_glu_backward: da_MF");
  check_rows_cols(dh_M2F, M, 2 * F, "gpt_oss_glu_backward: dh_M2F");
  visit_dtype(h_M2F.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const A alpha = A(act.alpha), limit = A(act.limit);
    const T* h = h_M2F.data<T>();
    const T* da = da_MF.data<T>();
    T* dh = dh_M2F.data<T>();
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t f = 0; f < F; ++f) {
        A dgate, dup;
        nn_detail::gpt_oss_glu_grad(load<T>(h[m * 2 * F + 2 * f]),
                                    load<T>(h[m * 2 * F + 2 * f + 1]), alpha, limit,
                                    load<T>(da[m * F + f]), dgate, dup);
        dh[m * 2 * F + 2 * f] = store<T>(dgate);
        dh[m * 2 * F + 2 * f + 1] = store<T>(dup);
      }
    }
  });
}

void scale_rows_forward(Tensor& out_MF, const Tensor& a_MF, const Tensor& score_M) {
  const int64_t M = a_MF.size(0), F = a_MF.size(1);
  check_rows_cols(out_MF, M, F, "scale_rows_forward: out_MF");
  check_shape(score_M, {M}, "scale_rows_forward: score_M");
  visit_dtype(a_MF.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* a = a_MF.data<T>();
    T* out = out_MF.data<T>();
    for (int64_t m = 0; m < M; ++m) {
      A s = score_at<A>(score_M, m);
      for (int64_t f = 0; f < F; ++f) out[m * F + f] = store<T>(load<T>(a[m * F + f]) * s);
    }
  });
}

void scale_rows_backward(Tensor& da_MF, Tensor& dscore_M, const Tensor& dout_MF,
                         const Tensor& a_MF, const Tensor& score_M, bool accumulate_dscore) {
  const int64_t M = a_MF.size(0), F = a_MF.size(1);
  check_rows_cols(da_MF, M, F, "scale_rows_backward: da_MF");
  check_rows_cols(dout_MF, M, F, "scale_rows_backward: dout_MF");
  check_shape(dscore_M, {M}, "scale_rows_backward: dscore_M");
  visit_dtype(a_MF.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* a = a_MF.data<T>();
    const T* g = dout_MF.data<T>();
    T* da = da_MF.data<T>();
    for (int64_t m = 0; m < M; ++m) {
      A s = score_at<A>(score_M, m);
      A dot = 0;
      for (int64_t f = 0; f < F; ++f) {
        A gf = load<T>(g[m * F + f]);
        dot += gf * load<T>(a[m * F + f]);
        da[m * F + f] = store<T>(gf * s);
      }
      if (!accumulate_dscore) dscore_M.set(m, 0.0);
      add_score<A>(dscore_M, m, dot);
    }
  });
}

void add_bias_forward(Tensor& y_MD, const Tensor& bias_D, const Tensor& score_M) {
  const int64_t M = y_MD.size(0), D = y_MD.size(1);
  check_shape(bias_D, {D}, "add_bias_forward: bias");
  check_same_dtype(y_MD, bias_D, "y", "bias");
  visit_dtype(y_MD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* b = bias_D.data<T>();
    T* y = y_MD.data<T>();
    for (int64_t m = 0; m < M; ++m) {
      if (score_M.defined()) {
        A s = score_at<A>(score_M, m);
        for (int64_t d = 0; d < D; ++d) y[m * D + d] = store<T>(load<T>(y[m * D + d]) + s * load<T>(b[d]));
      } else {
        for (int64_t d = 0; d < D; ++d) y[m * D + d] = store<T>(load<T>(y[m * D + d]) + load<T>(b[d]));
      }
    }
  });
}

void add_bias_backward(Tensor& dbias_D, Tensor& dscore_M, const Tensor& dy_MD,
                       const Tensor& bias_D, const Tensor& score_M) {
  const int64_t M = dy_MD.size(0), D = dy_MD.size(1);
  check_shape(dbias_D, {D}, "add_bias_backward: dbias");
  visit_dtype(dy_MD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    check_dtype(dbias_D, dtype_of<A>, "add_bias_backward: dbias");
    const T* g = dy_MD.data<T>();
    const T* b = bias_D.data<T>();
    A* db = acc_data<A>(dbias_D);
    for (int64_t m = 0; m < M; ++m) {
      A s = score_M.defined() ? score_at<A>(score_M, m) : A(1);
      A dot = 0;
      for (int64_t d = 0; d < D; ++d) {
        A gd = load<T>(g[m * D + d]);
        db[d] += score_M.defined() ? s * gd : gd;
        dot += gd * load<T>(b[d]);
      }
      if (score_M.defined()) add_score<A>(dscore_M, m, dot);
    }
  });
}

void rmsnorm_rows_forward(Tensor& out_MD, Tensor& rstd_M, const Tensor& y_MD, const Tensor& w_D,
                          double eps) {
  const int64_t M = y_MD.size(0), D = y_MD.size(1);
  check_rows_cols(out_MD, M, D, "rmsnorm_rows_forward: out");
  check_shape(rstd_M, {M}, "rmsnorm_rows_forward: rstd");
  check_shape(w_D, {D}, "rmsnorm_rows_forward: weight");
  visit_dtype(y_MD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    check_dtype(rstd_M, dtype_of<A>, "rmsnorm_rows_forward: rstd");
    const T* y = y_MD.data<T>();
    const T* w = w_D.data<T>();
    T* out = out_MD.data<T>();
    A* rstd = rstd_M.data<A>();
    for (int64_t m = 0; m < M; ++m) {
      A ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += load<T>(y[m * D + d]) * load<T>(y[m * D + d]);
      A r = A(1) / std::sqrt(ss / A(D) + A(eps));
      rstd[m] = r;
      for (int64_t d = 0; d < D; ++d) out[m * D + d] = store<T>(load<T>(w[d]) * (load<T>(y[m * D + d]) * r));
    }
  });
}

void rmsnorm_rows_backward(Tensor& dy_MD, Tensor& dw_D, const Tensor& dout_MD, const Tensor& y_MD,
                           const Tensor& w_D, const Tensor& rstd_M) {
  const int64_t M = y_MD.size(0), D = y_MD.size(1);
  check_rows_cols(dy_MD, M, D, "rmsnorm_rows_backward: dy");
  check_rows_cols(dout_MD, M, D, "rmsnorm_rows_backward: dout");
  visit_dtype(y_MD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    check_dtype(dw_D, dtype_of<A>, "rmsnorm_rows_backward: dweight");
    const T* y = y_MD.data<T>();
    const T* w = w_D.data<T>();
    const T* g = dout_MD.data<T>();
    const A* rstd = rstd_M.data<A>();
    T* dy = dy_MD.data<T>();
    A* dw = dw_D.data<A>();
    for (int64_t m = 0; m < M; ++m) {
      A r = rstd[m], mean = 0;
      for (int64_t d = 0; d < D; ++d) {
        A xhat = load<T>(y[m * D + d]) * r;
        A gd = load<T>(g[m * D + d]);
        dw[d] += gd * xhat;
        mean += gd * load<T>(w[d]) * xhat;
      }
      mean /= A(D);
      for (int64_t d = 0; d < D; ++d) {
        A xhat = load<T>(y[m * D + d]) * r;
        dy[m * D + d] = store<T>(r * (load<T>(g[m * D + d]) * load<T>(w[d]) - xhat * mean));
      }
    }
  });
}

}  // namespace tiermoe
