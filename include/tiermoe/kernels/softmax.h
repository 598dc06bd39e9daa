#pragma once
// Row softmax over the last dimension; ref:: and cpu:: twins. The math runs
// in f32 (f64 in f64 runs) whatever the storage dtype, as Hugging Face does
// for router and attention softmax; y may be f32 while x is bf16.
#include "tiermoe/core/tensor.h"

namespace tiermoe {

#define TIERMOE_SOFTMAX_DECLS                                                                   \
  /* y_RC = softmax(x_RC) along C */                                                            \
  void softmax_forward(Tensor& y_RC, const Tensor& x_RC);                                      \
  /* dx_RC (+)= y * (dy - sum(dy * y)) */                                                       \
  void softmax_backward(Tensor& dx_RC, const Tensor& dy_RC, const Tensor& y_RC,                \
                        bool accumulate = false);

namespace ref {
TIERMOE_SOFTMAX_DECLS
}
namespace cpu {
TIERMOE_SOFTMAX_DECLS
}

#undef TIERMOE_SOFTMAX_DECLS

}  // namespace tiermoe
