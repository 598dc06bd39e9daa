// The oracle: the whole weight converted to the activations' dtype, then ref::matmul.
#include "tiermoe/kernels/matmul_mixed.h"

#include "../matmul_mixed_check.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe {

bool is_narrower_or_same(DType stored, DType compute) {
  auto width = [](DType d) { return d == DType::bf16 ? 0 : d == DType::f32 ? 1 : 2; };
  return width(stored) <= width(compute);
}

namespace ref {

void matmul_forward_mixed(Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK, bool accumulate) {
  detail::check_mixed_weight(w_NK, x_MK, "matmul_forward_mixed");
  detail::check_mixed_forward(y_MN, x_MK, w_NK);
  const Tensor w = w_NK.dtype() == x_MK.dtype() ? w_NK : w_NK.to(x_MK.dtype());
  matmul_forward(y_MN, x_MK, w, accumulate);
}

void matmul_backward_dx_mixed(Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK,
                              bool accumulate) {
  detail::check_mixed_weight(w_NK, dy_MN, "matmul_backward_dx_mixed");
  detail::check_mixed_backward_dx(dx_MK, dy_MN, w_NK);
  const Tensor w = w_NK.dtype() == dy_MN.dtype() ? w_NK : w_NK.to(dy_MN.dtype());
  matmul_backward_dx(dx_MK, dy_MN, w, accumulate);
}

}  // namespace ref
}  // namespace tiermoe
