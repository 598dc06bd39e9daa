#pragma once
// Helpers shared by the matmul tests: the three products of a linear layer
// as one enum, their operand shapes, and the summation bound cpu:: results
// must keep from ref:: ones.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tiermoe/core/tensor.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe::testing {

enum class Op { forward, dx, dw };

inline const char* op_name(Op op) {
  switch (op) {
    case Op::forward:
      return "forward";
    case Op::dx:
      return "backward_dx";
    case Op::dw:
      return "backward_dw";
  }
  return "?";
}

// Operand shapes of out = op(a, b) for the layer y_MN = x_MK . w_NK^T, and the
// length of the sum behind each output element.
struct Operands {
  Shape out, a, b;
  int64_t reduction;
};

inline Operands operands(Op op, int64_t M, int64_t N, int64_t K) {
  switch (op) {
    case Op::forward:
      return {{M, N}, {M, K}, {N, K}, K};  // y = x . w^T
    case Op::dx:
      return {{M, K}, {M, N}, {N, K}, N};  // dx = dy . w
    case Op::dw:
      return {{N, K}, {M, N}, {M, K}, M};  // dw = dy^T . x
  }
  return {};
}

inline void run(Op op, bool cpu, Tensor& out, const Tensor& a, const Tensor& b, bool accumulate) {
  switch (op) {
    case Op::forward:
      cpu ? cpu::matmul_forward(out, a, b, accumulate) : ref::matmul_forward(out, a, b, accumulate);
      break;
    case Op::dx:
      cpu ? cpu::matmul_backward_dx(out, a, b, accumulate)
          : ref::matmul_backward_dx(out, a, b, accumulate);
      break;
    case Op::dw:
      cpu ? cpu::matmul_backward_dw(out, a, b, accumulate)
          : ref::matmul_backward_dw(out, a, b, accumulate);
      break;
  }
}

inline Tensor abs_f64(const Tensor& t) {
  Tensor r = t.to(DType::f64);
  for (int64_t i = 0; i < r.numel(); ++i) r.set(i, std::abs(r.get(i)));
  return r;
}

// Unit roundoff of a dtype: half its ulp at 1.
inline double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::f64:
      return 0x1p-53;
    case DType::f32:
      return 0x1p-24;
    case DType::bf16:
      return 0x1p-8;
  }
  return 1;
}

// Why this tolerance: any order of summing n products in precision u is
// within gamma_n * sum|a_k b_k| of the exact sum (gamma_n = n u / (1 - n u),
// Higham, "Accuracy and Stability of Numerical Algorithms", eq. 3.5), and
// bf16 products are exact in f32. cpu (other order, FMA, vdpbf16ps/AMX pair
// sums) and ref each meet that, so they differ by at most twice it. Then
// accumulate adds the old value with one more rounding (counted as n + 2),
// and a bf16 output rounds each side once more (u_out |want| each).
inline ::testing::AssertionResult within_summation_bound(const Tensor& got, const Tensor& want,
                                                         const Tensor& absdot, const Tensor& old,
                                                         int64_t n, DType acc,
                                                         const std::string& name) {
  double u = unit_roundoff(acc);
  double gamma = (n + 2) * u / (1 - (n + 2) * u);
  double u_out = got.dtype() == acc ? 0.0 : unit_roundoff(got.dtype());
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want.get(i), o = old.defined() ? std::abs(old.get(i)) : 0.0;
    double bound = 2 * gamma * (absdot.get(i) + o) + 2 * u_out * std::abs(w) * 1.01;
    if (!(std::abs(g - w) <= bound)) {
      return ::testing::AssertionFailure()
             << name << " at flat " << i << ": cpu " << g << ", ref " << w << ", bound " << bound;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tiermoe::testing
