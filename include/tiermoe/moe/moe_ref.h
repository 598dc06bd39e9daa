#pragma once
// The reference MoE layer: Hugging Face's loop, one token and one selected
// expert at a time, out[t] = sum_k weights[t, k] * expert_{ids[t, k]}(x[t]).
// No dispatch, no grouping, no absorption: the oracle the
// grouped layer is tested against. Plain loops in acc_t, rounding to the
// compute dtype where a real tensor of that dtype would (h, a, y, out).
#include <cstdint>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/moe/experts.h"

namespace tiermoe {

void moe_ref_forward(Tensor& out_TD, const Tensor& x_TD, const std::vector<int32_t>& ids_TK,
                     const Tensor& weights_TK, const GroupedExperts& experts);

}  // namespace tiermoe
