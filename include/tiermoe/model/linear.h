#pragma once
// nn.Linear over a block of rows, y = x W^T (+ b), on the cpu:: matmul
// kernels, forward and backward side by side. Weights are [out, in]. A frozen
// weight may be stored narrower than the activations (a bf16 checkpoint
// tensor in an f32 run): the products then run on kernels/matmul_mixed.h,
// whose results are those of the product on the widened weight.
#include <string>

#include "tiermoe/core/tensor.h"
#include "tiermoe/model/weight.h"

namespace tiermoe {

struct Linear {
  Weight weight;  // (out, in)
  Weight bias;    // (out) or undefined value (no bias)

  static Linear zeros(int64_t out, int64_t in, bool bias, DType compute,
                      MatrixAlloc alloc = MatrixAlloc::zeroed);
  int64_t out_features() const { return weight.value.size(0); }
  int64_t in_features() const { return weight.value.size(1); }

  // y_MO = x_MI . W^T (+ b)
  void forward(Tensor& y_MO, const Tensor& x_MI) const;
  // dx_MI (=, or += with accumulate) dy_MO . W; the weight and bias grads
  // accumulate when they require grad. dx_MI may be undefined (input needs
  // no gradient).
  void backward(Tensor& dx_MI, const Tensor& dy_MO, const Tensor& x_MI, bool accumulate = false);
};

// Elementwise helpers over tensors of one compute dtype, in acc_t and
// rounded once per element (a residual add rounds as torch's does).
void add_inplace(Tensor& y, const Tensor& x);       // y += x
void add_rows_bias(Tensor& y_MO, const Tensor& b_O);  // y[m] += b
// db_O += sum over rows of dy_MO (in the grad dtype, rows in order).
void bias_backward(Tensor& db_O, const Tensor& dy_MO);

// The non-finite guard: the flat index of the first NaN or Inf, or -1; and
// a check of an activation [rows, cols] that throws an Error naming
// `tensor` ("model.layers.3.mlp output"), the row and column, with a hint.
int64_t first_non_finite(const Tensor& t);
extern const char* const kNonFiniteHint;
void check_finite_activation(const Tensor& x_TD, const std::string& tensor);

}  // namespace tiermoe
