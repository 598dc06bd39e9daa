// The fast matmuls: bf16 and f32 run on oneDNN's brgemm matmul (AMX for bf16
// where the CPU has it, else AVX-512), f64 on TierMoE's own GEMM. Each op is
// one GEMM C (+)= A . B over the tensors as stored; only the strides say
// which operand is transposed, nothing is copied.
//
// Row-count invariance (DESIGN.md "Parity"): primitives are cached per exact
// shape, and oneDNN 2.6's brgemm kernels never split the reduction across
// threads or change its order with the row count, so row i of the forward
// and dx products is bitwise the same whatever M, and dw is bitwise
// unchanged by appending zero rows to dy and x. tests/kernels/test_matmul.cpp
// holds this; gemm_f64 guarantees it by construction.
#include "tiermoe/kernels/matmul.h"

#include "../matmul_check.h"
#include "gemm_f64.h"
#include "onednn.h"

namespace tiermoe::cpu {
namespace {

// C_MN (+)= A_MK . B_KN with A and B given as stored; see onednn::GemmShape.
void gemm(Tensor& c, const Tensor& a, const Tensor& b, onednn::GemmShape s) {
  s.in = a.dtype();
  s.out = c.dtype();
  if (s.in != DType::f64) {
    onednn::gemm(s, a.raw(), b.raw(), c.raw());
    return;
  }
  // Element (i, k) of A and (k, j) of B in the storage's row-major layout.
  int64_t a_row = s.a_transposed ? 1 : s.K, a_col = s.a_transposed ? s.M : 1;
  int64_t b_row = s.b_transposed ? 1 : s.N, b_col = s.b_transposed ? s.K : 1;
  gemm_f64(c.data<double>(), a.data<double>(), a_row, a_col, b.data<double>(), b_row, b_col, s.M,
           s.N, s.K, s.accumulate);
}

}  // namespace

void matmul_forward(Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK, bool accumulate) {
  detail::check_forward(y_MN, x_MK, w_NK);
  // y_MN = x_MK . (w_NK as [K, N] transposed)
  gemm(y_MN, x_MK, w_NK,
       {.M = x_MK.size(0),
        .N = w_NK.size(0),
        .K = x_MK.size(1),
        .b_transposed = true,
        .accumulate = accumulate});
}

void matmul_backward_dx(Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK, bool accumulate) {
  detail::check_backward_dx(dx_MK, dy_MN, w_NK);
  // dx_MK = dy_MN . w_NK: a GEMM with C [M, K] and reduction over N
  gemm(dx_MK, dy_MN, w_NK,
       {.M = dy_MN.size(0), .N = w_NK.size(1), .K = dy_MN.size(1), .accumulate = accumulate});
}

void matmul_backward_dw(Tensor& dw_NK, const Tensor& dy_MN, const Tensor& x_MK, bool accumulate) {
  detail::check_backward_dw(dw_NK, dy_MN, x_MK);
  // dw_NK = (dy_MN as [N, M] transposed) . x_MK: C [N, K], reduction over M
  gemm(dw_NK, dy_MN, x_MK,
       {.M = dy_MN.size(1),
        .N = x_MK.size(1),
        .K = dy_MN.size(0),
        .a_transposed = true,
        .accumulate = accumulate});
}

}  // namespace tiermoe::cpu
