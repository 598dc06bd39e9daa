#pragma once
// The dense SwiGLU MLP of a non-MoE layer (mlp_only_layers, or layers that
// decoder_sparse_step skips): y = down(silu(gate x) * up x). gate_proj and
// up_proj are stored stacked, gate rows then up rows, so one GEMM computes
// both; their HF tensors are row slices of it.
#include <string>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/model/linear.h"

namespace tiermoe {

struct DenseMlpSaved {
  Tensor x_TD;   // input (dW13)
  Tensor h_T2I;  // gate then up columns (activation backward)
  Tensor a_TI;   // silu(gate) * up (dW_down)
  void clear() { *this = DenseMlpSaved(); }
};

class DenseMlp {
 public:
  DenseMlp(int64_t hidden, int64_t intermediate, DType compute);

  void forward(Tensor& y_TD, const Tensor& x_TD, DenseMlpSaved& saved) const;
  // dx_TD (=, or += with accumulate); parameter grads +=.
  void backward(Tensor& dx_TD, const Tensor& dy_TD, const DenseMlpSaved& saved,
                bool accumulate = false);

  // The stacked gate/up weight ("w13", (2I, D)) and down_proj ((D, I)).
  Weight& w13() { return w13_.weight; }
  Weight& down() { return down_.weight; }
  int64_t intermediate() const { return I_; }

 private:
  int64_t I_;
  Linear w13_;   // (2I, D) gate rows then up rows
  Linear down_;  // (D, I)
};

}  // namespace tiermoe
