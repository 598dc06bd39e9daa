// Elementwise, so the fast version is the ref formula split across threads:
// each element is computed by the same scalar expression, so cpu:: equals
// ref:: bit for bit whatever the thread count.
#include "tiermoe/kernels/activation.h"

#include "../nn_common.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {
constexpr int64_t kGrain = 1 << 14;  // elements per task: exp dominates, ~10 us of work
}

void silu_forward(Tensor& y, const Tensor& x) {
  check_elementwise(y, "y", x, "x", "silu_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) yp[i] = store<T>(silu(load(xp[i])));
    });
  });
}

void silu_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate) {
  check_elementwise(dy, "dy", x, "x", "silu_backward");
  check_elementwise(dx, "dx", x, "x", "silu_backward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
    parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        put(dxp[i], load(dyp[i]) * silu_grad(load(xp[i])), accumulate);
      }
    });
  });
}

void swiglu_forward(Tensor& a_NF, const Tensor& h_N2F) {
  int64_t F = check_swiglu(a_NF, "a_NF", h_N2F, "swiglu_forward");
  visit_dtype(h_N2F.dtype(), [&]<class T>() {
    const T* h = h_N2F.data<T>();
    T* a = a_NF.data<T>();
    parallel_for(h_N2F.size(0), std::max<int64_t>(1, kGrain / std::max<int64_t>(F, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t n = begin; n < end; ++n) {
                     const T* gate = h + n * 2 * F;
                     swiglu_row(a + n * F, gate, gate + F, F);
                   }
                 });
  });
}

void swiglu_backward(Tensor& dh_N2F, const Tensor& da_NF, const Tensor& h_N2F, bool accumulate) {
  int64_t F = check_swiglu(da_NF, "da_NF", h_N2F, "swiglu_backward");
  check_elementwise(dh_N2F, "dh_N2F", h_N2F, "h_N2F", "swiglu_backward");
  visit_dtype(h_N2F.dtype(), [&]<class T>() {
    const T* h = h_N2F.data<T>();
    const T* da = da_NF.data<T>();
    T* dh = dh_N2F.data<T>();
    parallel_for(h_N2F.size(0), std::max<int64_t>(1, kGrain / std::max<int64_t>(F, 1)),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t n = begin; n < end; ++n) {
                     const T* gate = h + n * 2 * F;
                     T* dgate = dh + n * 2 * F;
                     swiglu_backward_row(dgate, dgate + F, gate, gate + F, da + n * F, F,
                                         accumulate);
                   }
                 });
  });
}

void sigmoid_gate_forward(Tensor& y, const Tensor& x, const Tensor& g) {
  check_sigmoid_gate({{&y, "y"}}, x, g, "sigmoid_gate_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const T *xp = x.data<T>(), *gp = g.data<T>();
    T* yp = y.data<T>();
    parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        yp[i] = store<T>(load(xp[i]) * load(store<T>(sigmoid(load(gp[i])))));
      }
    });
  });
}

void sigmoid_gate_backward(Tensor& dx, Tensor& dg, const Tensor& dy, const Tensor& x,
                           const Tensor& g) {
  check_sigmoid_gate({{&dy, "dy"}, {&dx, "dx"}, {&dg, "dg"}}, x, g, "sigmoid_gate_backward");
  visit_dtype(x.dtype(), [&]<class T>() {
    const T *xp = x.data<T>(), *gp = g.data<T>(), *dyp = dy.data<T>();
    T *dxp = dx.data<T>(), *dgp = dg.data<T>();
    parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto s = sigmoid(load(gp[i])), d = load(dyp[i]);
        dxp[i] = store<T>(d * s);
        dgp[i] = store<T>(d * load(xp[i]) * s * (decltype(s)(1) - s));
      }
    });
  });
}

}  // namespace tiermoe::cpu
