#pragma once
// Token embedding: gather table rows by token id, and its backward, a
// scatter-add into the table gradient. ref:: and cpu:: twins.
//
// Ids are int32 everywhere in TierMoE (every supported vocabulary fits). An id
// outside [0, V) is an Error naming its position and value. The table and the
// output share one dtype; the table gradient is f32 for bf16/f32 tables and
// f64 for f64 ones, since rows that share an id sum into it. Those rows are
// added in increasing token order, so the gradient does not depend on the
// thread count and cpu:: equals ref:: bit for bit.
#include <cstdint>
#include <span>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

#define TIERMOE_EMBEDDING_DECLS                                                                \
  /* out_TD[t] = table_VD[ids_T[t]] */                                                         \
  void embedding_forward(Tensor& out_TD, const Tensor& table_VD, std::span<const int32_t> ids_T); \
  /* dtable_VD[v] (+)= sum of dout_TD[t] over t with ids_T[t] == v, in increasing t;          \
     without accumulate, rows no id names become zero */                                       \
  void embedding_backward(Tensor& dtable_VD, const Tensor& dout_TD,                            \
                          std::span<const int32_t> ids_T, bool accumulate = false);

namespace ref {
TIERMOE_EMBEDDING_DECLS
}
namespace cpu {
TIERMOE_EMBEDDING_DECLS
}

#undef TIERMOE_EMBEDDING_DECLS

}  // namespace tiermoe
