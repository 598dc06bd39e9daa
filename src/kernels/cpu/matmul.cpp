// The fast matmuls: f32 and bf16 run on TierMoE's own blocked GEMM
// (kernels/cpu/gemm/) on the process's ISA (kernels/cpu_isa.h), or on
// oneDNN's matmul when that ISA is `onednn` (the benchmark baseline); f64 on
// gemm_f64. Each op is one GEMM C (+)= A . B over the tensors as stored: only
// the strides say which operand is transposed; the kernels pack what they
// read.
//
// Row-count invariance (docs/architecture.md, parity rules) holds by construction on every
// TierMoE ISA (gemm/microkernel.h): row i of the forward and dx products is
// bitwise the same whatever M, and dw is bitwise unchanged by appending zero
// rows to dy and x. tests/kernels/test_matmul.cpp and test_gemm_isa.cpp hold
// it; gemm_f64 guarantees it the same way.
#include "tiermoe/kernels/matmul.h"

#include "../matmul_check.h"
#include "gemm/driver.h"
#include "gemm_f64.h"
#include "matmul_product.h"
#include "tiermoe/kernels/cpu_isa.h"

namespace tiermoe::cpu {

bool product_reads_narrower_b(DType compute, DType stored) {
  return compute == DType::f32 && stored == DType::bf16 && cpu_isa() != CpuIsa::onednn;
}

void product(Tensor& c, const Tensor& a, const Tensor& b, onednn::GemmShape s) {
  s.in = a.dtype();
  s.out = c.dtype();
  TIERMOE_ASSERT(b.dtype() == s.in || product_reads_narrower_b(s.in, b.dtype()), "A ", a.str(),
                 " with B ", b.str());
  // Element (i, k) of A and (k, j) of B in the storage's row-major layout.
  int64_t a_row = s.a_transposed ? 1 : s.K, a_col = s.a_transposed ? s.M : 1;
  int64_t b_row = s.b_transposed ? 1 : s.N, b_col = s.b_transposed ? s.K : 1;
  if (s.in == DType::f64) {
    gemm_f64(c.data<double>(), a.data<double>(), a_row, a_col, b.data<double>(), b_row, b_col, s.M,
             s.N, s.K, s.accumulate);
    return;
  }
  const CpuIsa isa = cpu_isa();
  if (isa == CpuIsa::onednn) {
    onednn::gemm(s, a.raw(), b.raw(), c.raw());
    return;
  }
  const gemm::StoreC store{c.raw(), s.N, s.out, s.accumulate};
  gemm::run(gemm::microkernel(isa, s.in),
            {.M = s.M,
             .N = s.N,
             .K = s.K,
             .a = {a.raw(), a_row, a_col, s.in},
             .b = {b.raw(), b_row, b_col, b.dtype()}},
            gemm::store_epilogue(store));
}

void matmul_forward(Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK, bool accumulate) {
  detail::check_forward(y_MN, x_MK, w_NK);
  // y_MN = x_MK . (w_NK as [K, N] transposed)
  product(y_MN, x_MK, w_NK,
          {.M = x_MK.size(0),
           .N = w_NK.size(0),
           .K = x_MK.size(1),
           .b_transposed = true,
           .accumulate = accumulate});
}

void matmul_backward_dx(Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK, bool accumulate) {
  detail::check_backward_dx(dx_MK, dy_MN, w_NK);
  // dx_MK = dy_MN . w_NK: a GEMM with C [M, K] and reduction over N
  product(dx_MK, dy_MN, w_NK,
          {.M = dy_MN.size(0), .N = w_NK.size(1), .K = dy_MN.size(1), .accumulate = accumulate});
}

void matmul_backward_dw(Tensor& dw_NK, const Tensor& dy_MN, const Tensor& x_MK, bool accumulate) {
  detail::check_backward_dw(dw_NK, dy_MN, x_MK);
  // dw_NK = (dy_MN as [N, M] transposed) . x_MK: C [N, K], reduction over M
  product(dw_NK, dy_MN, x_MK,
          {.M = dy_MN.size(1),
           .N = x_MK.size(1),
           .K = dy_MN.size(0),
           .a_transposed = true,
           .accumulate = accumulate});
}

}  // namespace tiermoe::cpu
