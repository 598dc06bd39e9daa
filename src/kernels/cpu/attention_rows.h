#pragma once
// Internal to the cpu:: attention: the plain path f64 runs take (one query
// row at a time; attention_rows.cpp). Arguments are checked by the caller.
#include <cstdint>
#include <span>

#include "tiermoe/core/tensor.h"
#include "tiermoe/kernels/attention.h"

namespace tiermoe::cpu {

void attention_rows_forward(Tensor& out, Tensor& lse_BTH, const Tensor& q, const Tensor& k,
                            const Tensor& v, const AttentionOptions& opt);
void attention_rows_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& lse_BTH, const AttentionOptions& opt, bool accumulate,
                             Tensor* dsinks_H);

}  // namespace tiermoe::cpu
