#pragma once
// The dense SwiGLU MLP of a non-MoE layer (mlp_only_layers, or layers that
// decoder_sparse_step skips): y = down(silu(gate x) * up x). gate_proj and
// up_proj are stored stacked, gate rows then up rows, so one GEMM computes
// both; their HF tensors are row slices of it.
//
// LoRA (lora.h): gate_proj's and up_proj's adapters add into the stacked
// output's columns [0, I) and [I, 2I), down_proj's into y; each right after
// its GEMM, as PEFT wraps each nn.Linear.
#include <memory>
#include <string>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/model/linear.h"
#include "tiermoe/model/lora.h"

namespace tiermoe {

struct DenseMlpSaved {
  Tensor x_TD;   // input (dW13)
  Tensor h_T2I;  // gate then up columns (activation backward)
  Tensor a_TI;   // silu(gate) * up (dW_down)
  Tensor u_gate_TR, u_up_TR, u_down_TR;  // LoRA intermediates (adapted projections only)
  void clear() { *this = DenseMlpSaved(); }
};

class DenseMlp {
 public:
  DenseMlp(int64_t hidden, int64_t intermediate, DType compute,
           MatrixAlloc alloc = MatrixAlloc::zeroed);

  void forward(Tensor& y_TD, const Tensor& x_TD, DenseMlpSaved& saved) const;
  // dx_TD (=, or += with accumulate); parameter grads +=.
  void backward(Tensor& dx_TD, const Tensor& dy_TD, const DenseMlpSaved& saved,
                bool accumulate = false);

  // The stacked gate/up weight ("w13", (2I, D)) and down_proj ((D, I)).
  Weight& w13() { return w13_.weight; }
  Weight& down() { return down_.weight; }
  int64_t intermediate() const { return I_; }

  // Adapters for the projections `config` targets; `prefix` is the module
  // path ("model.layers.1.mlp."). A drawn from `rng` in gate, up, down order.
  void enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng);
  std::vector<LoraAdapter*> lora_adapters();  // gate, up, down (the adapted ones)

 private:
  int64_t I_;
  DType compute_;  // the weights may be stored narrower (linear.h)
  Linear w13_;   // (2I, D) gate rows then up rows
  Linear down_;  // (D, I)
  std::unique_ptr<LoraAdapter> lora_gate_, lora_up_, lora_down_;
};

}  // namespace tiermoe
