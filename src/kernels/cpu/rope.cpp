// Rows in parallel. Every element goes through the same scalar expression as
// in ref:: (the rounding order is part of the contract), so the twins agree
// bit for bit.
#include "tiermoe/kernels/rope.h"

#include <algorithm>
#include <cmath>

#include "../nn_common.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {
int64_t row_grain(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
}
}  // namespace

void rope_tables(Tensor& cos_RP, Tensor& sin_RP, std::span<const int32_t> pos_R, double theta) {
  int64_t P = check_rope_tables(cos_RP, sin_RP, "rope_tables");
  check_shape_is(cos_RP, {int64_t(pos_R.size()), P}, "cos_RP", "rope_tables");
  TIERMOE_CHECK(theta > 0, "rope theta must be positive, got " + std::to_string(theta),
                "rope_tables", "check rope_theta in the model config");
  visit_dtype(cos_RP.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    T* cs = cos_RP.data<T>();
    T* ss = sin_RP.data<T>();
    parallel_for(int64_t(pos_R.size()), row_grain(P * 8), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        rope_table_row<T>(
            cs + r * P, ss + r * P, pos_R[size_t(r)], P,
            [&](int64_t i) { return rope_inv_freq<A>(i, P, theta); }, A(1));
      }
    });
  });
}

void rope_tables_scaled(Tensor& cos_RP, Tensor& sin_RP, std::span<const int32_t> pos_R,
                        std::span<const double> inv_freq, double scale) {
  int64_t P = check_rope_tables(cos_RP, sin_RP, "rope_tables_scaled");
  check_shape_is(cos_RP, {int64_t(pos_R.size()), P}, "cos_RP", "rope_tables_scaled");
  check_rope_frequencies(inv_freq, P, "rope_tables_scaled");
  visit_dtype(cos_RP.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    T* cs = cos_RP.data<T>();
    T* ss = sin_RP.data<T>();
    parallel_for(int64_t(pos_R.size()), row_grain(P * 8), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        rope_table_row<T>(
            cs + r * P, ss + r * P, pos_R[size_t(r)], P,
            [&](int64_t i) { return inv_freq[size_t(i)]; }, A(scale));
      }
    });
  });
}

void rope_forward(Tensor& y, const Tensor& x, const Tensor& cos_RP, const Tensor& sin_RP) {
  check_rope_tables(cos_RP, sin_RP, "rope_forward");
  int64_t H = check_rope_input(x, "x", cos_RP, "rope_forward");
  check_elementwise(y, "y", x, "x", "rope_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const int64_t Pr = cos_RP.size(1), half = Pr / 2, P = x.size(-1);
    const T* cs = cos_RP.data<T>();
    const T* ss = sin_RP.data<T>();
    const T* xs = x.data<T>();
    T* ys = y.data<T>();
    parallel_for(cos_RP.size(0), row_grain(H * P), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* c = cs + r * Pr;
        const T* s = ss + r * Pr;
        for (int64_t h = 0; h < H; ++h) {
          const T* xh = xs + (r * H + h) * P;
          T* yh = ys + (r * H + h) * P;
          for (int64_t i = 0; i < half; ++i) {
            rope_pair<T>(yh[i], yh[i + half], load(xh[i]), load(xh[i + half]), load(c[i]),
                         load(s[i]), load(c[i + half]), load(s[i + half]));
          }
          for (int64_t i = Pr; i < P; ++i) yh[i] = xh[i];  // partial rotary: passed through
        }
      }
    });
  });
}

void rope_backward(Tensor& dx, const Tensor& dy, const Tensor& cos_RP, const Tensor& sin_RP,
                   bool accumulate) {
  check_rope_tables(cos_RP, sin_RP, "rope_backward");
  int64_t H = check_rope_input(dy, "dy", cos_RP, "rope_backward");
  check_elementwise(dx, "dx", dy, "dy", "rope_backward");
  visit_dtype(dy.dtype(), [&]<class T>() {
    const int64_t Pr = cos_RP.size(1), half = Pr / 2, P = dy.size(-1);
    const T* cs = cos_RP.data<T>();
    const T* ss = sin_RP.data<T>();
    const T* dys = dy.data<T>();
    T* dxs = dx.data<T>();
    parallel_for(cos_RP.size(0), row_grain(H * P), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* c = cs + r * Pr;
        const T* s = ss + r * Pr;
        for (int64_t h = 0; h < H; ++h) {
          const T* dyh = dys + (r * H + h) * P;
          T* dxh = dxs + (r * H + h) * P;
          for (int64_t i = 0; i < half; ++i) {
            rope_pair_backward<T>(dxh[i], dxh[i + half], load(dyh[i]), load(dyh[i + half]),
                                  load(c[i]), load(s[i]), load(c[i + half]), load(s[i + half]),
                                  accumulate);
          }
          for (int64_t i = Pr; i < P; ++i) put(dxh[i], load(dyh[i]), accumulate);
        }
      }
    });
  });
}

}  // namespace tiermoe::cpu
