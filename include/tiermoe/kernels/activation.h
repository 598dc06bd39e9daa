#pragma once
// SiLU, SwiGLU and the sigmoid output gate, forward and backward side by
// side; ref:: and cpu:: twins.
// Elementwise math runs in acc_t<T> (f32 for bf16/f32, f64 for f64) and is
// rounded to T once at the store. Gradients overwrite unless accumulate.
#include "tiermoe/core/tensor.h"

namespace tiermoe {

#define TIERMOE_ACTIVATION_DECLS                                                              \
  /* y = x * sigmoid(x), any shape */                                                         \
  void silu_forward(Tensor& y, const Tensor& x);                                              \
  void silu_backward(Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate = false); \
  /* h_N2F holds the gate columns [0, F) then the up columns [F, 2F) of each row:             \
     a_NF = silu(gate) * up */                                                                \
  void swiglu_forward(Tensor& a_NF, const Tensor& h_N2F);                                     \
  void swiglu_backward(Tensor& dh_N2F, const Tensor& da_NF, const Tensor& h_N2F,              \
                       bool accumulate = false);                                              \
  /* y = x * sigmoid(g), any shape (gated attention's output gate): sigmoid(g)                \
     rounded to T, then the product, as torch's x * torch.sigmoid(g) */                       \
  void sigmoid_gate_forward(Tensor& y, const Tensor& x, const Tensor& g);                     \
  /* dx = dy * s, dg = dy * x * s * (1 - s), s = sigmoid(g); both overwritten */              \
  void sigmoid_gate_backward(Tensor& dx, Tensor& dg, const Tensor& dy, const Tensor& x,       \
                             const Tensor& g);

namespace ref {
TIERMOE_ACTIVATION_DECLS
}
namespace cpu {
TIERMOE_ACTIVATION_DECLS
}

#undef TIERMOE_ACTIVATION_DECLS

}  // namespace tiermoe
