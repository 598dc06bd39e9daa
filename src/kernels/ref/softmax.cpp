#include "tiermoe/kernels/softmax.h"

#include <algorithm>
#include <cmath>

#include "../nn_common.h"

namespace tiermoe::ref {

using namespace nn_detail;

void softmax_forward(Tensor& y_RC, const Tensor& x_RC) {
  int64_t C = check_rows(x_RC, "x_RC", "softmax_forward");
  check_same_shape_as(y_RC, x_RC, "y_RC", "x_RC", "softmax_forward");
  visit_in_out(x_RC.dtype(), y_RC.dtype(), "x_RC", "y_RC", "softmax_forward",
               [&]<class X, class Y>() {
                 using A = acc_t<Y>;
                 for (int64_t r = 0; r < row_count(x_RC); ++r) {
                   const X* x = x_RC.data<X>() + r * C;
                   Y* y = y_RC.data<Y>() + r * C;
                   A m = -INFINITY;
                   for (int64_t c = 0; c < C; ++c) m = std::max(m, A(load(x[c])));
                   A sum = 0;
                   for (int64_t c = 0; c < C; ++c) sum += std::exp(A(load(x[c])) - m);
                   for (int64_t c = 0; c < C; ++c)
                     y[c] = store<Y>(std::exp(A(load(x[c])) - m) / sum);
                 }
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
                 for (int64_t r = 0; r < row_count(y_RC); ++r) {
                   const Y* y = y_RC.data<Y>() + r * C;
                   const Y* dy = dy_RC.data<Y>() + r * C;
                   X* dx = dx_RC.data<X>() + r * C;
                   A dot = 0;
                   for (int64_t c = 0; c < C; ++c) dot += load(dy[c]) * load(y[c]);
                   for (int64_t c = 0; c < C; ++c) {
                     put(dx[c], A(load(y[c]) * (load(dy[c]) - dot)), accumulate);
                   }
                 }
               });
}

}  // namespace tiermoe::ref
