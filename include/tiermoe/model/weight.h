#pragma once
// A trainable tensor of the model and its gradient, and the parameter list
// an optimizer, --save-grads and LoRA address by Hugging Face name.
//
// Gradients are f32 (f64 in f64 runs) whatever the compute dtype, since they
// feed fp32 master weights. They accumulate (+=) across backwards until
// zero_grad(). A frozen weight (requires_grad false) holds no gradient, and
// backward skips the products only that gradient needs.
#include <string>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/io/hf_names.h"

namespace tiermoe {

// The dtype statistics (RMSNorm rstd, attention lse) are kept in: f32, f64 in f64 runs.
inline DType acc_dtype_for(DType compute) {
  return compute == DType::f64 ? DType::f64 : DType::f32;
}
// The dtype gradients are kept in for a compute dtype.
inline DType grad_dtype_for(DType compute) { return acc_dtype_for(compute); }

// How a model's weight matrices (embedding, LM head, attention and MLP
// projections, experts) come into being: allocated zeroed in the compute
// dtype, or unbound: shape only and no memory, for the checkpoint loader to
// bind to the checkpoint's own bytes (CausalLM::from_checkpoint with
// WeightBinding::mapped). Norms, biases and the router are always allocated.
enum class MatrixAlloc { zeroed, unbound };
// How from_checkpoint fills the weight matrices: copy converts every tensor to
// the compute dtype (trainable weights); mapped binds each matrix to the
// checkpoint's bytes at their stored width (frozen weights: LoRA).
enum class WeightBinding { copy, mapped };
// A tensor of `shape` whose data must not be read until the loader binds it.
Tensor unbound_tensor(Shape shape, DType dtype);

// Gradients are allocated on first use (a backward, or params()), so a model
// frozen right after loading never holds them.
struct Weight {
  Tensor value;  // compute dtype
  Tensor grad;   // grad_dtype_for(compute); undefined until used, and while frozen
  bool requires_grad = true;

  // A zero-filled weight that requires grad.
  static Weight zeros(Shape shape, DType compute);
  // zeros, or an unbound matrix (MatrixAlloc above).
  static Weight matrix(Shape shape, DType compute, MatrixAlloc alloc);
  // The gradient to accumulate into: allocated zeroed on first use; an
  // undefined Tensor when frozen (kernels then skip the weight's product).
  Tensor grad_sink();
  // Freezing drops the gradient.
  void set_requires_grad(bool on);
  void zero_grad();
};

// One parameter by its Hugging Face name. `value` and `grad` are views
// sharing the model's storage (a per-expert tensor is a slice of the stacked
// expert weights), so writing into them updates the model. `grad` is
// undefined while the parameter is frozen.
struct ModelParam {
  std::string name;
  HfRole role;
  // The weight; for experts kept quantized (GroupedExperts::quantized) a
  // placeholder of the widened shape with no memory, never trainable.
  Tensor value;
  Tensor grad;
  bool requires_grad = true;
  // The expert it belongs to (a routed expert's weight or LoRA adapter), by
  // its index in the layer; -1 for everything else. With expert parallelism
  // only the expert's owner holds it, and its gradient is complete there.
  int64_t expert = -1;
  // Hugging Face stores the transpose of its last two dims (gpt-oss's x-major
  // fused experts: value is [E, 2F, D], the checkpoint's gate_up_proj
  // [E, D, 2F]); checkpoint reads and writes transpose it.
  bool hf_transposed = false;
};

}  // namespace tiermoe
