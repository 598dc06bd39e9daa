#pragma once
// Internal to the causal conv's twins (kernels/causal_conv.h): the input
// checks both make, with the same messages, and where a token may read from.
#include <cstdint>
#include <span>
#include <string_view>

#include "attention_options.h"
#include "nn_common.h"
#include "tiermoe/kernels/causal_conv.h"

namespace tiermoe::nn_detail {

struct ConvDims {
  int64_t B, T, C, K;
};

inline ConvDims check_conv(const Tensor& x, const Tensor& w_CK,
                           std::span<const int32_t> doc_start_BT, std::string_view op) {
  check_rank(x, 3, "x", op, "x is [B, T, C]");
  check_rank(w_CK, 2, "w_CK", op, "w_CK is [C, K] (conv1d.weight without its middle dim)");
  check_same_dtype_as(w_CK, x, "w_CK", "x", op);
  const ConvDims d{x.size(0), x.size(1), x.size(2), w_CK.size(1)};
  TIERMOE_CHECK(w_CK.size(0) == d.C && d.K >= 1,
                detail::str_of("w_CK is ", w_CK.str(), " for x ", x.str()), std::string(op),
                "one kernel of K >= 1 taps per channel");
  check_doc_starts(doc_start_BT, d.B, d.T, op);
  return d;
}

// The first token x[b, t] may read: its document's (or row's) first.
inline int64_t first_readable(std::span<const int32_t> doc_start_BT, int64_t b, int64_t t,
                              int64_t T) {
  return doc_start_BT.empty() ? 0 : doc_start_BT[size_t(b * T + t)];
}

}  // namespace tiermoe::nn_detail
