#include "tiermoe/kernels/rmsnorm.h"

#include <cmath>

#include "../nn_common.h"

namespace tiermoe::ref {

using namespace nn_detail;

void rmsnorm_forward(Tensor& y, Tensor& rstd_R, const Tensor& x, const Tensor& w_D, double eps,
                     RmsNormCast cast) {
  int64_t D = check_rmsnorm(x, w_D, "rmsnorm_forward");
  check_elementwise(y, "y", x, "x", "rmsnorm_forward");
  if (rstd_R.defined()) check_rstd(rstd_R, x, "rmsnorm_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* w = w_D.data<T>();
    for (int64_t r = 0; r < row_count(x); ++r) {
      const T* xr = x.data<T>() + r * D;
      T* yr = y.data<T>() + r * D;
      A sum_sq = 0;
      for (int64_t d = 0; d < D; ++d) sum_sq += load(xr[d]) * load(xr[d]);
      A rstd = A(1) / std::sqrt(sum_sq / A(D) + A(eps));
      if (rstd_R.defined()) rstd_R.data<A>()[r] = rstd;
      for (int64_t d = 0; d < D; ++d) {
        yr[d] = store<T>(norm_weight(w[d], cast) * normed<T>(load(xr[d]) * rstd, cast));
      }
    }
  });
}

void rmsnorm_backward(Tensor& dx, Tensor& dw_D, const Tensor& dy, const Tensor& x,
                      const Tensor& w_D, const Tensor& rstd_R, bool accumulate, RmsNormCast cast) {
  int64_t D = check_rmsnorm(x, w_D, "rmsnorm_backward");
  check_elementwise(dy, "dy", x, "x", "rmsnorm_backward");
  check_elementwise(dx, "dx", x, "x", "rmsnorm_backward");
  check_rstd(rstd_R, x, "rmsnorm_backward");
  if (dw_D.defined()) {
    check_shape_is(dw_D, {D}, "dw_D", "rmsnorm_backward");
    check_dtype_is(dw_D, acc_dtype(x.dtype()), "dw_D", "rmsnorm_backward",
                   "weight gradients are f32 (f64 in f64 runs)");
    if (!accumulate) dw_D.zero();
  }
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* w = w_D.data<T>();
    for (int64_t r = 0; r < row_count(x); ++r) {
      const T* xr = x.data<T>() + r * D;
      const T* dyr = dy.data<T>() + r * D;
      T* dxr = dx.data<T>() + r * D;
      A rstd = rstd_R.data<A>()[r];
      A dot = 0;  // sum of g * n
      for (int64_t d = 0; d < D; ++d)
        dot += norm_weight(w[d], cast) * load(dyr[d]) * (load(xr[d]) * rstd);
      A mean = dot / A(D);
      for (int64_t d = 0; d < D; ++d) {
        A n = load(xr[d]) * rstd;
        put(dxr[d], rstd * (norm_weight(w[d], cast) * load(dyr[d]) - n * mean), accumulate);
      }
      if (dw_D.defined()) {
        A* dw = dw_D.data<A>();
        for (int64_t d = 0; d < D; ++d) dw[d] += load(dyr[d]) * normed<T>(load(xr[d]) * rstd, cast);
      }
    }
  });
}

}  // namespace tiermoe::ref
