#pragma once
// A projection with its LoRA branch, as PEFT wraps an nn.Linear: y = x W^T
// (+ b) plus the branch right after it (lora.h), the branch absent when the
// module is not a target. The attention kinds keep one per projection.
#include <memory>
#include <string>

#include "tiermoe/model/linear.h"
#include "tiermoe/model/lora.h"

namespace tiermoe {

// y_MO = proj(x_MI) + the branch (if `lora`); u_MR is set to the branch's
// x A^T for backward.
void adapted_forward(const Linear& proj, const LoraAdapter* lora, Tensor& y_MO, Tensor& u_MR,
                     const Tensor& x_MI);
// dx_MI (=, or += with accumulate) through both; their weight grads +=.
void adapted_backward(Linear& proj, LoraAdapter* lora, Tensor& dx_MI, const Tensor& dy_MO,
                      const Tensor& x_MI, const Tensor& u_MR, bool accumulate);
// An adapter for `proj`, the module at `path`, drawn from `rng` when `config`
// targets it; null otherwise.
std::unique_ptr<LoraAdapter> adapter_for(const Linear& proj, const LoraConfig& config,
                                         const std::string& path, DType compute, Rng& rng);

}  // namespace tiermoe
