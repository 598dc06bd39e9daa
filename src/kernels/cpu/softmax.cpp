// Rows in parallel; within a row the exponentials are computed once into a
// scratch row and the reductions vectorize (their summation order differs
// from ref::, hence the tolerance in the tests).
#include "tiermoe/kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../nn_common.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {
int64_t row_grain(int64_t C) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(C, 1)); }
}  // namespace

void softmax_forward(Tensor& y_RC, const Tensor& x_RC) {
  int64_t C = check_rows(x_RC, "x_RC", "softmax_forward");
  check_same_shape_as(y_RC, x_RC, "y_RC", "x_RC", "softmax_forward");
  visit_in_out(x_RC.dtype(), y_RC.dtype(), "x_RC", "y_RC", "softmax_forward",
               [&]<class X, class Y>() {
                 using A = acc_t<Y>;
                 const X* xs = x_RC.data<X>();
                 Y* ys = y_RC.data<Y>();
                 parallel_for(row_count(x_RC), row_grain(C), [&](int64_t begin, int64_t end) {
                   std::vector<A> e(static_cast<size_t>(C));
                   for (int64_t r = begin; r < end; ++r) {
                     const X* x = xs + r * C;
                     Y* y = ys + r * C;
                     A m = -INFINITY;
#pragma omp simd reduction(max : m)
                     for (int64_t c = 0; c < C; ++c) m = std::max(m, A(load(x[c])));
                     for (int64_t c = 0; c < C; ++c) e[size_t(c)] = std::exp(A(load(x[c])) - m);
                     A sum = 0;
#pragma omp simd reduction(+ : sum)
                     for (int64_t c = 0; c < C; ++c) sum += e[size_t(c)];
                     for (int64_t c = 0; c < C; ++c) y[c] = store<Y>(e[size_t(c)] / sum);
                   }
                 });
               });
}

void softmax_backward(Tensor& dx_RC, const Tensor& dy_RC, const Tensor& y_RC, bool accumulate) {
  int64_t C = check_rows(y_RC, "y_RC", "softmax_backward");
  check_same_shape_as(dy_RC, y_RC, "dy_RC", "y_RC", "softmax_backward");
  check_same_dtype_as(dy_RC, y_RC, "dy_RC", "y_RC", "softmax_backward");
  check_same_shape_as(dx_RC, y_RC, "dx_RC", "y_RC", "softmax_backward");
  visit_in_out(dx_RC.dtype(), y_RC.dtype(), "dx_RC", "y_RC", "softmax_backward",
               [&]<class X, class Y>() {
                 using A = acc_t<Y>;
                 const Y* ys = y_RC.data<Y>();
                 const Y* dys = dy_RC.data<Y>();
                 X* dxs = dx_RC.data<X>();
                 parallel_for(row_count(y_RC), row_grain(C), [&](int64_t begin, int64_t end) {
                   for (int64_t r = begin; r < end; ++r) {
                     const Y* y = ys + r * C;
                     const Y* dy = dys + r * C;
                     X* dx = dxs + r * C;
                     A dot = 0;
#pragma omp simd reduction(+ : dot)
                     for (int64_t c = 0; c < C; ++c) dot += load(dy[c]) * load(y[c]);
                     for (int64_t c = 0; c < C; ++c) {
                       put(dx[c], A(load(y[c]) * (load(dy[c]) - dot)), accumulate);
                     }
                   }
                 });
               });
}

}  // namespace tiermoe::cpu
