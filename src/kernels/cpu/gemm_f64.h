#pragma once
// TierMoE's own f64 GEMM (oneDNN has none). f64 is the parity mode, so this
// kernel is exact before it is fast: every output element is summed in k
// order, one multiply and one add per step (no FMA), the same arithmetic as
// the ref kernels, so its results equal ref's bit for bit. It is cache
// blocked, vectorized and parallel so small models still train at a useful
// speed. Each element's sum never depends on M, N, the blocking or the
// thread count.
#include <cstdint>

namespace tiermoe::cpu {

// C_MN (+)= A_MK . B_KN with element (i, k) of A at a[i * a_row + k * a_col]
// and (k, j) of B at b[k * b_row + j * b_col]; C is row-major [M, N].
// accumulate: C = C + (A.B), the product summed first, as ref does.
void gemm_f64(double* c, const double* a, int64_t a_row, int64_t a_col, const double* b,
              int64_t b_row, int64_t b_col, int64_t M, int64_t N, int64_t K, bool accumulate);

}  // namespace tiermoe::cpu
