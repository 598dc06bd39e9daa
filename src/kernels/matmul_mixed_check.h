#pragma once
// Argument checks shared by the ref and cpu mixed-dtype matmuls.
#include <string>

#include "matmul_check.h"
#include "tiermoe/kernels/matmul_mixed.h"

namespace tiermoe::detail {

// The weight's dtype must be no wider than the activations'; returns whether
// it is narrower (a conversion is needed).
inline bool check_mixed_weight(const Tensor& w_NK, const Tensor& act, std::string_view op) {
  TIERMOE_CHECK(w_NK.defined() && act.defined(), str_of(op, ": undefined operand"), std::string(op),
                "allocate the tensors before calling");
  TIERMOE_CHECK(is_narrower_or_same(w_NK.dtype(), act.dtype()),
                str_of(op, ": w_NK is ", w_NK.str(), ", wider than the activations ", act.str()),
                std::string(op), "convert a wider weight to the compute dtype once, at load time");
  return w_NK.dtype() != act.dtype();
}

// The weight's shape under the product's checks: a tensor of act's dtype
// with w's shape stands in for it (no data is read).
inline void check_mixed_forward(const Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK) {
  constexpr std::string_view op = "matmul_forward_mixed";
  for (auto [t, name] : {std::pair{&y_MN, "y_MN"}, {&x_MK, "x_MK"}, {&w_NK, "w_NK"}}) {
    check_matrix(*t, op, name);
  }
  const int64_t M = x_MK.size(0), K = x_MK.size(1), N = w_NK.size(0);
  check_shape(w_NK, {N, K}, str_of(op, ": w_NK"));
  check_shape(y_MN, {M, N}, str_of(op, ": y_MN"));
  check_out_dtype(y_MN, x_MK.dtype(), op, "y_MN");
  check_no_alias(y_MN, x_MK, op, "y_MN", "x_MK");
  check_no_alias(y_MN, w_NK, op, "y_MN", "w_NK");
}

inline void check_mixed_backward_dx(const Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK) {
  constexpr std::string_view op = "matmul_backward_dx_mixed";
  for (auto [t, name] : {std::pair{&dx_MK, "dx_MK"}, {&dy_MN, "dy_MN"}, {&w_NK, "w_NK"}}) {
    check_matrix(*t, op, name);
  }
  const int64_t M = dy_MN.size(0), N = dy_MN.size(1), K = w_NK.size(1);
  check_shape(w_NK, {N, K}, str_of(op, ": w_NK"));
  check_shape(dx_MK, {M, K}, str_of(op, ": dx_MK"));
  check_out_dtype(dx_MK, dy_MN.dtype(), op, "dx_MK");
  check_no_alias(dx_MK, dy_MN, op, "dx_MK", "dy_MN");
  check_no_alias(dx_MK, w_NK, op, "dx_MK", "w_NK");
}

}  // namespace tiermoe::detail
