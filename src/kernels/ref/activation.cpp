#include "tiermoe/kernels/activation.h"

#include "../nn_common.h"

namespace tiermoe::ref {

using namespace nn_detail;

void silu_forward(Tensor& y, const Tensor& x) {
  check_elementwise(y, "y", x, "x", "silu_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) yp[i] = store<T>(silu(load(xp[i])));
  });
}

void silu_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate) {
  check_elementwise(dy, "dy", x, "x", "silu_backward");
  check_elementwise(dx, "dx", x, "x", "silu_backward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      put(dxp[i], load(dyp[i]) * silu_grad(load(xp[i])), accumulate);
    }
  });
}

void swiglu_forward(Tensor& a_NF, const Tensor& h_N2F) {
  int64_t F = check_swiglu(a_NF, "a_NF", h_N2F, "swiglu_forward");
  visit_dtype(h_N2F.dtype(), [&]<class T>() {
    for (int64_t n = 0; n < h_N2F.size(0); ++n) {
      const T* gate = h_N2F.data<T>() + n * 2 * F;
      const T* up = gate + F;
      T* a = a_NF.data<T>() + n * F;
      for (int64_t f = 0; f < F; ++f) a[f] = store<T>(silu(load(gate[f])) * load(up[f]));
    }
  });
}

void swiglu_backward(Tensor& dh_N2F, const Tensor& da_NF, const Tensor& h_N2F, bool accumulate) {
  int64_t F = check_swiglu(da_NF, "da_NF", h_N2F, "swiglu_backward");
  check_elementwise(dh_N2F, "dh_N2F", h_N2F, "h_N2F", "swiglu_backward");
  visit_dtype(h_N2F.dtype(), [&]<class T>() {
    for (int64_t n = 0; n < h_N2F.size(0); ++n) {
      const T* gate = h_N2F.data<T>() + n * 2 * F;
      const T* up = gate + F;
      const T* da = da_NF.data<T>() + n * F;
      T* dgate = dh_N2F.data<T>() + n * 2 * F;
      T* dup = dgate + F;
      for (int64_t f = 0; f < F; ++f) {
        auto g = load(gate[f]), u = load(up[f]), d = load(da[f]);
        put(dgate[f], d * u * silu_grad(g), accumulate);
        put(dup[f], d * silu(g), accumulate);
      }
    }
  });
}

void sigmoid_gate_forward(Tensor& y, const Tensor& x, const Tensor& g) {
  check_sigmoid_gate({{&y, "y"}}, x, g, "sigmoid_gate_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const T *xp = x.data<T>(), *gp = g.data<T>();
    T* yp = y.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      yp[i] = store<T>(load(xp[i]) * load(store<T>(sigmoid(load(gp[i])))));
    }
  });
}

void sigmoid_gate_backward(Tensor& dx, Tensor& dg, const Tensor& dy, const Tensor& x,
                           const Tensor& g) {
  check_sigmoid_gate({{&dy, "dy"}, {&dx, "dx"}, {&dg, "dg"}}, x, g, "sigmoid_gate_backward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const T *xp = x.data<T>(), *gp = g.data<T>(), *dyp = dy.data<T>();
    T *dxp = dx.data<T>(), *dgp = dg.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const auto s = sigmoid(load(gp[i])), d = load(dyp[i]);
      dxp[i] = store<T>(d * s);
      dgp[i] = store<T>(d * load(xp[i]) * s * (decltype(s)(1) - s));
    }
  });
}

}  // namespace tiermoe::ref
