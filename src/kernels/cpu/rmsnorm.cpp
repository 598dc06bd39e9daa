// Rows in parallel with vectorized row reductions (their summation order
// differs from ref::). The weight gradient is a sum over rows, so it gets its
// own pass split by columns: each column still adds its rows in increasing
// order, so dw does not depend on the thread count and equals ref::'s.
#include "tiermoe/kernels/rmsnorm.h"

#include <algorithm>
#include <cmath>

#include "../nn_common.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {
int64_t row_grain(int64_t D) { return std::max<int64_t>(1, 16384 / D); }
}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd_R, const Tensor& x, const Tensor& w_D, double eps,
                     RmsNormCast cast) {
  int64_t D = check_rmsnorm(x, w_D, "rmsnorm_forward");
  check_elementwise(y, "y", x, "x", "rmsnorm_forward");
  if (rstd_R.defined()) check_rstd(rstd_R, x, "rmsnorm_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* w = w_D.data<T>();
    const T* xs = x.data<T>();
    T* ys = y.data<T>();
    A* rstds = rstd_R.defined() ? rstd_R.data<A>() : nullptr;
    parallel_for(row_count(x), row_grain(D), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = xs + r * D;
        T* yr = ys + r * D;
        A sum_sq = 0;
#pragma omp simd reduction(+ : sum_sq)
        for (int64_t d = 0; d < D; ++d) sum_sq += load(xr[d]) * load(xr[d]);
        A rstd = A(1) / std::sqrt(sum_sq / A(D) + A(eps));
        if (rstds) rstds[r] = rstd;
        for (int64_t d = 0; d < D; ++d) {
          yr[d] = store<T>(norm_weight(w[d], cast) * normed<T>(load(xr[d]) * rstd, cast));
        }
      }
    });
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
  }
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* w = w_D.data<T>();
    const T* xs = x.data<T>();
    const T* dys = dy.data<T>();
    const A* rstds = rstd_R.data<A>();
    T* dxs = dx.data<T>();
    int64_t R = row_count(x);
    parallel_for(R, row_grain(D), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = xs + r * D;
        const T* dyr = dys + r * D;
        T* dxr = dxs + r * D;
        A rstd = rstds[r];
        A dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d)
          dot += norm_weight(w[d], cast) * load(dyr[d]) * (load(xr[d]) * rstd);
        A mean = dot / A(D);
        for (int64_t d = 0; d < D; ++d) {
          A n = load(xr[d]) * rstd;
          put(dxr[d], rstd * (norm_weight(w[d], cast) * load(dyr[d]) - n * mean), accumulate);
        }
      }
    });
    if (!dw_D.defined()) return;
    A* dw = dw_D.data<A>();
    constexpr int64_t kCols = 64;  // columns per task: one cache line of f32 per row
    parallel_for((D + kCols - 1) / kCols, 1, [&](int64_t begin, int64_t end) {
      for (int64_t blk = begin; blk < end; ++blk) {
        int64_t d0 = blk * kCols, d1 = std::min(D, d0 + kCols);
        if (!accumulate) std::fill(dw + d0, dw + d1, A(0));
        for (int64_t r = 0; r < R; ++r) {
          const T* xr = xs + r * D;
          const T* dyr = dys + r * D;
          A rstd = rstds[r];
          for (int64_t d = d0; d < d1; ++d)
            dw[d] += load(dyr[d]) * normed<T>(load(xr[d]) * rstd, cast);
        }
      }
    });
  });
}

}  // namespace tiermoe::cpu
