#pragma once
// A trainable tensor as the optimizer sees it: the working copy the model
// computes with, the master copy the optimizer updates, and the gradient.
//
// Master and gradient dtypes follow the working dtype:
//   working bf16 -> master f32 (a separate tensor), grad f32
//   working f32  -> master is the working tensor itself, grad f32
//   working f64  -> master is the working tensor itself, grad f64
// so f32 and f64 runs hold no second copy, and the optimizer's arithmetic
// always runs in the master dtype (fp32, or f64 in the f64 parity mode).
//
// Members are Tensor handles: copies of a Parameter alias the same storage,
// like references to one torch.nn.Parameter, so the model, the optimizer and
// the checkpoint writer can each hold one. Change contents in place (the
// model's backward accumulates into `grad`); never rebind a member of a
// Parameter an optimizer already holds.
#include <string>

#include "tiermoe/core/memory.h"
#include "tiermoe/core/tensor.h"

namespace tiermoe {

struct Parameter {
  std::string name;  // Hugging Face tensor name
  Tensor value;      // working copy in the compute dtype (tag weights)
  Tensor master;     // bf16 runs: f32 copy (tag optimizer); otherwise the same tensor as value
  Tensor grad;       // master dtype, same shape (tag grads)
  // HF Trainer exempts biases and norm weights from weight decay; the model
  // clears this flag for them.
  bool weight_decay = true;
  // A routed expert's parameter: the expert's index in its layer (-1 for
  // any other). Under expert parallelism only its owner holds it and its
  // gradient is complete there; every other parameter is replicated on
  // every rank and its gradient is summed over them.
  int64_t expert = -1;

  // A new parameter with zero working, master and grad tensors.
  static Parameter create(std::string name, Shape shape, DType dtype,
                          MemoryTracker& tracker = MemoryTracker::process());
  // Wraps a module's existing tensors (handles, not copies). `grad`, when
  // given, must have the master dtype and value's shape; otherwise a zero
  // grad is allocated. A bf16 value gets its f32 master copied from it.
  static Parameter wrap(std::string name, Tensor value, Tensor grad = {},
                        MemoryTracker& tracker = MemoryTracker::process());

  // The dtype optimizer states and gradients use for this working dtype.
  static DType master_dtype_for(DType working);
  DType master_dtype() const { return master.dtype(); }
  bool has_separate_master() const { return value.dtype() == DType::bf16; }
  int64_t numel() const { return value.numel(); }

  // value <- master rounded to nearest even (bf16 runs); a no-op otherwise.
  // Optimizers call it after every update.
  void refresh_working();
};

}  // namespace tiermoe
