// Stored-width weights on the cpu:: product. A bf16 weight in an f32 run on
// TierMoE's GEMM is read as it is stored: the GEMM widens it while packing
// its panels (matmul_product.h), at the speed of the plain product. Else
// (f64 runs, the onednn baseline) the weight is converted block by block
// into scratch of at most kMixedScratchBytes and each block's product is
// one cpu:: GEMM over the whole reduction (see the header for why the blocks
// split output columns only).
#include "tiermoe/kernels/matmul_mixed.h"

#include <algorithm>

#include "../matmul_mixed_check.h"
#include "matmul_product.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe::cpu {
namespace {

// dst[r, c] = w[n0 + r, k0 + c] converted to Dst, for r < n1 - n0, c < k1 - k0.
template <class Dst>
void convert_block(Dst* dst, const Tensor& w_NK, int64_t n0, int64_t n1, int64_t k0, int64_t k1) {
  const int64_t K = w_NK.size(1), cols = k1 - k0;
  auto run = [&]<class Src>() {
    const Src* src = w_NK.data<Src>();
    parallel_for(n1 - n0, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) {
                     const Src* s = src + (n0 + r) * K + k0;
                     Dst* d = dst + r * cols;
                     for (int64_t c = 0; c < cols; ++c) d[c] = Dst(load<Src>(s[c]));
                   }
                 });
  };
  visit_dtype(w_NK.dtype(), run);
}

// out[:, c0:c0+cols] (+)= block[M, cols]
void scatter_columns(Tensor& out_MX, const Tensor& block_MC, int64_t c0, bool accumulate) {
  const int64_t M = block_MC.size(0), C = block_MC.size(1), X = out_MX.size(1);
  visit_dtype(out_MX.dtype(), [&]<class T>() {
    if constexpr (!std::is_same_v<T, bf16>) {
      const T* b = block_MC.data<T>();
      T* o = out_MX.data<T>();
      parallel_for(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)),
                   [&](int64_t m0, int64_t m1) {
                     for (int64_t m = m0; m < m1; ++m) {
                       T* row = o + m * X + c0;
                       const T* src = b + m * C;
                       if (accumulate) {
                         for (int64_t c = 0; c < C; ++c) row[c] += src[c];
                       } else {
                         std::copy(src, src + C, row);
                       }
                     }
                   });
    }
  });
}

// Columns per block so that a block of `depth` values per column fits the scratch.
int64_t block_columns(int64_t depth, DType dt, int64_t total) {
  const int64_t per = std::max<int64_t>(1, depth) * int64_t(dtype_size(dt));
  return std::clamp<int64_t>(int64_t(kMixedScratchBytes) / per, 1, std::max<int64_t>(total, 1));
}

}  // namespace

size_t mixed_scratch_bytes(int64_t rows, int64_t depth, int64_t width, DType compute) {
  if (product_reads_narrower_b(compute, DType::bf16)) return 0;
  const int64_t cols = block_columns(depth, compute, width);
  const size_t s = dtype_size(compute);
  return size_t(cols * depth) * s + (cols < width ? size_t(rows * cols) * s : 0);
}

void matmul_forward_mixed(Tensor& y_MN, const Tensor& x_MK, const Tensor& w_NK, bool accumulate) {
  if (!detail::check_mixed_weight(w_NK, x_MK, "matmul_forward_mixed")) {
    matmul_forward(y_MN, x_MK, w_NK, accumulate);
    return;
  }
  detail::check_mixed_forward(y_MN, x_MK, w_NK);
  const DType dt = x_MK.dtype();
  const int64_t M = x_MK.size(0), K = x_MK.size(1), N = w_NK.size(0);
  if (M == 0 || N == 0) return;
  if (product_reads_narrower_b(dt, w_NK.dtype())) {
    product(y_MN, x_MK, w_NK,
            {.M = M, .N = N, .K = K, .b_transposed = true, .accumulate = accumulate});
    return;
  }
  const int64_t nb = block_columns(K, dt, N);
  const bool whole = nb >= N;  // one block: write y directly
  Tensor w_blk = Tensor::empty({nb, K}, dt), y_blk;
  if (!whole) y_blk = Tensor::empty({M, nb}, dt);
  for (int64_t n0 = 0; n0 < N; n0 += nb) {
    const int64_t n1 = std::min(N, n0 + nb), cols = n1 - n0;
    Tensor w = w_blk.rows(0, cols);
    visit_dtype(dt, [&]<class A>() {
      if constexpr (!std::is_same_v<A, bf16>) convert_block(w.data<A>(), w_NK, n0, n1, 0, K);
    });
    if (whole) {
      matmul_forward(y_MN, x_MK, w, accumulate);
      break;
    }
    Tensor y = cols == nb ? y_blk : Tensor::empty({M, cols}, dt);
    matmul_forward(y, x_MK, w);
    scatter_columns(y_MN, y, n0, accumulate);
  }
}

void matmul_backward_dx_mixed(Tensor& dx_MK, const Tensor& dy_MN, const Tensor& w_NK,
                              bool accumulate) {
  if (!detail::check_mixed_weight(w_NK, dy_MN, "matmul_backward_dx_mixed")) {
    matmul_backward_dx(dx_MK, dy_MN, w_NK, accumulate);
    return;
  }
  detail::check_mixed_backward_dx(dx_MK, dy_MN, w_NK);
  const DType dt = dy_MN.dtype();
  const int64_t M = dy_MN.size(0), N = dy_MN.size(1), K = w_NK.size(1);
  if (M == 0 || K == 0) return;
  if (product_reads_narrower_b(dt, w_NK.dtype())) {
    product(dx_MK, dy_MN, w_NK, {.M = M, .N = K, .K = N, .accumulate = accumulate});
    return;
  }
  const int64_t kb = block_columns(N, dt, K);
  const bool whole = kb >= K;
  for (int64_t k0 = 0; k0 < K; k0 += kb) {
    const int64_t k1 = std::min(K, k0 + kb), cols = k1 - k0;
    Tensor w = Tensor::empty({N, cols}, dt);
    visit_dtype(dt, [&]<class A>() {
      if constexpr (!std::is_same_v<A, bf16>) convert_block(w.data<A>(), w_NK, 0, N, k0, k1);
    });
    if (whole) {
      matmul_backward_dx(dx_MK, dy_MN, w, accumulate);
      break;
    }
    Tensor dx = Tensor::empty({M, cols}, dt);
    matmul_backward_dx(dx, dy_MN, w);
    scatter_columns(dx_MK, dx, k0, accumulate);
  }
}

}  // namespace tiermoe::cpu
