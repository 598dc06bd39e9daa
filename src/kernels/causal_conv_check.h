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

// Backward's checks: check_conv's, and each gradient shaped as its input
// (dw_CK may be undefined: a frozen weight).
inline ConvDims check_conv_backward(const Tensor& dx, const Tensor& dw_CK, const Tensor& dy,
                                    const Tensor& x, const Tensor& w_CK,
                                    std::span<const int32_t> doc_start_BT) {
  const char* op = "causal_conv_silu_backward";
  const ConvDims d = check_conv(x, w_CK, doc_start_BT, op);
  check_elementwise(dy, "dy", x, "x", op);
  check_elementwise(dx, "dx", x, "x", op);
  if (dw_CK.defined()) {
    check_shape_is(dw_CK, w_CK.shape(), "dw_CK", op);
    check_dtype_is(dw_CK, acc_dtype(x.dtype()), "dw_CK", op,
                   "weight gradients are f32 (f64 in f64 runs)");
  }
  return d;
}

// The first token x[b, t] may read: its document's (or row's) first.
inline int64_t first_readable(std::span<const int32_t> doc_start_BT, int64_t b, int64_t t,
                              int64_t T) {
  return doc_start_BT.empty() ? 0 : doc_start_BT[size_t(b * T + t)];
}

}  // namespace tiermoe::nn_detail
