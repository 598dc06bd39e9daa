// The oracle: plain loops, one accumulator per output element, summed in
// order of the reduction index in acc_t<T> (f32 for bf16 and f32, f64 for
// f64), then rounded once to the output dtype. With accumulate the finished
// sum is added to the old output: out = out + sum.
#include "tiermoe/kernels/matmul.h"

#include "../matmul_check.h"

namespace tiermoe::ref {
namespace {

// Writes a finished sum to an output element of dtype O (T, or f32 for bf16).
template <class O, class A>
void put(O& out, A sum, bool accumulate) {
  if constexpr (std::is_same_v<O, bf16>) {
    out = float_to_bf16(accumulate ? bf16_to_float(out) + sum : sum);
  } else {
    out = accumulate ? O(out + sum) : O(sum);
  }
}

// Calls fn.template operator()<T, O>() for the inputs' dtype T and output O.
template <class Fn>
void visit_in_out(const Tensor& in, const Tensor& out, Fn&& fn) {
  visit_dtype(in.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bf16>) {
      if (out.dtype() == DType::f32) return fn.template operator()<T, float>();
    }
    fn.template operator()<T, T>();
  });
}

}  // namespace

void matmul_forward(Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK, bool accumulate) {
  detail::check_forward(y_MN, x_MK, w_NK);
  int64_t M = x_MK.size(0), K = x_MK.size(1), N = w_NK.size(0);
  visit_in_out(x_MK, y_MN, [&]<class T, class O>() {
    const T* x = x_MK.data<T>();
    const T* w = w_NK.data<T>();
    O* y = y_MN.data<O>();
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t n = 0; n < N; ++n) {
        acc_t<T> sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += load(x[i * K + k]) * load(w[n * K + k]);
        put(y[i * N + n], sum, accumulate);
      }
    }
  });
}

void matmul_backward_dx(Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK, bool accumulate) {
  detail::check_backward_dx(dx_MK, dy_MN, w_NK);
  int64_t M = dy_MN.size(0), N = dy_MN.size(1), K = w_NK.size(1);
  visit_in_out(dy_MN, dx_MK, [&]<class T, class O>() {
    const T* dy = dy_MN.data<T>();
    const T* w = w_NK.data<T>();
    O* dx = dx_MK.data<O>();
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t k = 0; k < K; ++k) {
        acc_t<T> sum = 0;
        for (int64_t n = 0; n < N; ++n) sum += load(dy[i * N + n]) * load(w[n * K + k]);
        put(dx[i * K + k], sum, accumulate);
      }
    }
  });
}

void matmul_backward_dw(Tensor& dw_NK, const Tensor& dy_MN, const Tensor& x_MK, bool accumulate) {
  detail::check_backward_dw(dw_NK, dy_MN, x_MK);
  int64_t M = dy_MN.size(0), N = dy_MN.size(1), K = x_MK.size(1);
  visit_in_out(dy_MN, dw_NK, [&]<class T, class O>() {
    const T* dy = dy_MN.data<T>();
    const T* x = x_MK.data<T>();
    O* dw = dw_NK.data<O>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t k = 0; k < K; ++k) {
        acc_t<T> sum = 0;
        for (int64_t i = 0; i < M; ++i) sum += load(dy[i * N + n]) * load(x[i * K + k]);
        put(dw[n * K + k], sum, accumulate);
      }
    }
  });
}

}  // namespace tiermoe::ref
