#include "tiermoe/model/linear.h"

#include <cmath>

#include "tiermoe/kernels/matmul.h"
#include "tiermoe/kernels/matmul_mixed.h"

namespace tiermoe {

Weight Weight::zeros(Shape shape, DType compute) {
  Weight w;
  w.value = Tensor::zeros(std::move(shape), compute, MemTag::weights);
  return w;
}

Weight Weight::matrix(Shape shape, DType compute, MatrixAlloc alloc) {
  if (alloc == MatrixAlloc::zeroed) return zeros(std::move(shape), compute);
  Weight w;
  w.value = unbound_tensor(std::move(shape), compute);
  return w;
}

Tensor unbound_tensor(Shape shape, DType dtype) {
  return Tensor::from_external(nullptr, std::move(shape), dtype, nullptr);
}

Tensor Weight::grad_sink() {
  if (!requires_grad) return Tensor();
  if (!grad.defined()) {
    grad = Tensor::zeros(value.shape(), grad_dtype_for(value.dtype()), MemTag::grads);
  }
  return grad;
}

void Weight::set_requires_grad(bool on) {
  requires_grad = on;
  if (!on) grad = Tensor();
}

void Weight::zero_grad() {
  if (grad.defined()) grad.zero();
}

Linear Linear::zeros(int64_t out, int64_t in, bool bias, DType compute, MatrixAlloc alloc) {
  Linear l;
  l.weight = Weight::matrix({out, in}, compute, alloc);
  if (bias) l.bias = Weight::zeros({out}, compute);
  return l;
}

void Linear::forward(Tensor& y_MO, const Tensor& x_MI) const {
  cpu::matmul_forward_mixed(y_MO, x_MI, weight.value);
  if (bias.value.defined()) add_rows_bias(y_MO, bias.value);
}

void Linear::backward(Tensor& dx_MI, const Tensor& dy_MO, const Tensor& x_MI, bool accumulate) {
  if (dx_MI.defined()) cpu::matmul_backward_dx_mixed(dx_MI, dy_MO, weight.value, accumulate);
  if (Tensor dw = weight.grad_sink(); dw.defined()) {
    cpu::matmul_backward_dw(dw, dy_MO, x_MI, /*accumulate=*/true);
  }
  if (bias.value.defined()) {
    if (Tensor db = bias.grad_sink(); db.defined()) bias_backward(db, dy_MO);
  }
}

void add_inplace(Tensor& y, const Tensor& x) {
  TIERMOE_ASSERT(y.numel() == x.numel() && y.dtype() == x.dtype(), y.str(), " += ", x.str());
  visit_dtype(y.dtype(), [&]<class T>() {
    T* yp = y.data<T>();
    const T* xp = x.data<T>();
    for (int64_t i = 0; i < y.numel(); ++i) yp[i] = store<T>(load<T>(yp[i]) + load<T>(xp[i]));
  });
}

void add_rows_bias(Tensor& y_MO, const Tensor& b_O) {
  const int64_t O = b_O.numel(), M = y_MO.numel() / O;
  visit_dtype(y_MO.dtype(), [&]<class T>() {
    T* y = y_MO.data<T>();
    const T* b = b_O.data<T>();
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t o = 0; o < O; ++o) y[m * O + o] = store<T>(load<T>(y[m * O + o]) + load<T>(b[o]));
    }
  });
}

void bias_backward(Tensor& db_O, const Tensor& dy_MO) {
  const int64_t O = db_O.numel(), M = dy_MO.numel() / O;
  visit_dtype(dy_MO.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    A* db = db_O.data<A>();
    const T* dy = dy_MO.data<T>();
    for (int64_t o = 0; o < O; ++o) {
      A s = 0;
      for (int64_t m = 0; m < M; ++m) s += load<T>(dy[m * O + o]);
      db[o] += s;
    }
  });
}

int64_t first_non_finite(const Tensor& t) {
  int64_t found = -1;
  visit_dtype(t.dtype(), [&]<class T>() {
    const T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!std::isfinite(double(load<T>(p[i])))) {
        found = i;
        return;
      }
    }
  });
  return found;
}

const char* const kNonFiniteHint =
    "training diverged or the input is bad: lower the learning rate (or clip gradients), check "
    "the data and the weights; in bf16 runs an overflow looks like this (try --dtype f32)";

void check_finite_activation(const Tensor& x_TD, const std::string& tensor) {
  const int64_t i = first_non_finite(x_TD);
  if (i < 0) return;
  const int64_t cols = x_TD.size(x_TD.dim() - 1);
  throw Error(detail::str_of("non-finite value ", x_TD.get(i), " in ", tensor, " (row ", i / cols,
                             ", column ", i % cols, ")"),
              "CausalLM::forward", kNonFiniteHint);
}

}  // namespace tiermoe
