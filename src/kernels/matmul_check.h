#pragma once
// Argument checks shared by the ref and cpu matmul kernels, so both reject
// the same inputs with the same messages.
#include <string>
#include <string_view>

#include "tiermoe/core/tensor.h"

namespace tiermoe::detail {

inline void check_matrix(const Tensor& t, std::string_view op, std::string_view name) {
  TIERMOE_CHECK(t.defined(), str_of(op, ": ", name, " is undefined"), std::string(op),
                "allocate the tensor (Tensor::empty) before calling");
  TIERMOE_CHECK(t.dim() == 2, str_of(op, ": ", name, " must be 2-D, got ", t.str()),
                std::string(op), "flatten leading dimensions with view({rows, cols})");
}

// The output is the compute dtype, or f32 when computing in bf16 (the f32
// accumulator kept unrounded).
inline void check_out_dtype(const Tensor& out, DType compute, std::string_view op,
                            std::string_view name) {
  bool ok = out.dtype() == compute || (compute == DType::bf16 && out.dtype() == DType::f32);
  TIERMOE_CHECK(ok,
                str_of(op, ": ", name, " is ", dtype_name(out.dtype()), " but the inputs are ",
                       dtype_name(compute)),
                std::string(op), "the output must be the input dtype, or f32 for bf16 inputs");
}

inline bool overlaps(const Tensor& a, const Tensor& b) {
  auto a0 = static_cast<const char*>(a.raw()), b0 = static_cast<const char*>(b.raw());
  return a.nbytes() > 0 && b.nbytes() > 0 && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

inline void check_no_alias(const Tensor& out, const Tensor& in, std::string_view op,
                           std::string_view out_name, std::string_view in_name) {
  TIERMOE_CHECK(!overlaps(out, in), str_of(op, ": ", out_name, " overlaps input ", in_name),
                std::string(op), "write the product into a separate tensor");
}

// Checks out = a (.) b where the three matrices have the given names and the
// shapes (rows, cols) each op implies; a and b share the compute dtype.
struct MatmulArgs {
  std::string_view op;
  const Tensor& out;
  std::string_view out_name;
  const Tensor& a;
  std::string_view a_name;
  const Tensor& b;
  std::string_view b_name;
};

inline void check_matmul_args(const MatmulArgs& m, const Shape& out_shape, const Shape& b_shape) {
  check_shape(m.b, b_shape, str_of(m.op, ": ", m.b_name));
  check_shape(m.out, out_shape, str_of(m.op, ": ", m.out_name));
  check_same_dtype(m.a, m.b, str_of(m.op, ": ", m.a_name), m.b_name);
  check_out_dtype(m.out, m.a.dtype(), m.op, m.out_name);
  check_no_alias(m.out, m.a, m.op, m.out_name, m.a_name);
  check_no_alias(m.out, m.b, m.op, m.out_name, m.b_name);
}

// y_MN = x_MK . w_NK^T
inline void check_forward(const Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK) {
  constexpr std::string_view op = "matmul_forward";
  for (auto [t, name] : {std::pair{&y_MN, "y_MN"}, {&x_MK, "x_MK"}, {&w_NK, "w_NK"}}) {
    check_matrix(*t, op, name);
  }
  int64_t M = x_MK.size(0), K = x_MK.size(1), N = w_NK.size(0);
  check_matmul_args({op, y_MN, "y_MN", x_MK, "x_MK", w_NK, "w_NK"}, {M, N}, {N, K});
}

// dx_MK = dy_MN . w_NK
inline void check_backward_dx(const Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK) {
  constexpr std::string_view op = "matmul_backward_dx";
  for (auto [t, name] : {std::pair{&dx_MK, "dx_MK"}, {&dy_MN, "dy_MN"}, {&w_NK, "w_NK"}}) {
    check_matrix(*t, op, name);
  }
  int64_t M = dy_MN.size(0), N = dy_MN.size(1), K = w_NK.size(1);
  check_matmul_args({op, dx_MK, "dx_MK", dy_MN, "dy_MN", w_NK, "w_NK"}, {M, K}, {N, K});
}

// dw_NK = dy_MN^T . x_MK
inline void check_backward_dw(const Tensor& dw_NK, const Tensor& dy_MN, const Tensor& x_MK) {
  constexpr std::string_view op = "matmul_backward_dw";
  for (auto [t, name] : {std::pair{&dw_NK, "dw_NK"}, {&dy_MN, "dy_MN"}, {&x_MK, "x_MK"}}) {
    check_matrix(*t, op, name);
  }
  int64_t M = dy_MN.size(0), N = dy_MN.size(1), K = x_MK.size(1);
  check_matmul_args({op, dw_NK, "dw_NK", dy_MN, "dy_MN", x_MK, "x_MK"}, {N, K}, {M, K});
}

}  // namespace tiermoe::detail
