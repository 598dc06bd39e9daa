#include "tiermoe/model/lm_head.h"

#include <algorithm>

#include "tiermoe/kernels/cross_entropy.h"
#include "tiermoe/kernels/matmul.h"
#include "tiermoe/kernels/matmul_mixed.h"

namespace tiermoe {

int64_t count_targets(std::span<const int32_t> targets_N) {
  return std::count_if(targets_N.begin(), targets_N.end(),
                       [](int32_t t) { return t != kIgnoreIndex; });
}

double lm_head_loss(Tensor& dn_ND, Tensor& dw_VD, const Tensor& n_ND, const Tensor& w_VD,
                    std::span<const int32_t> targets_N, int64_t chunk) {
  const int64_t N = n_ND.size(0), V = w_VD.size(0);
  TIERMOE_CHECK(int64_t(targets_N.size()) == N,
                detail::str_of(targets_N.size(), " targets for ", N, " rows"), "lm_head_loss",
                "pass one target per token row");
  TIERMOE_CHECK(chunk >= 0, detail::str_of("LM head chunk ", chunk, " must be >= 0"),
                "--lm-head-chunk", "0 means one chunk of every token");
  const bool grad = dn_ND.defined();
  const int64_t count = count_targets(targets_N);
  const int64_t C = chunk == 0 ? std::max<int64_t>(N, 1) : chunk;
  const DType dt = n_ND.dtype();
  double loss = 0;
  for (int64_t r0 = 0; r0 < N; r0 += C) {
    const int64_t r1 = std::min(N, r0 + C), rows = r1 - r0;
    const std::span<const int32_t> t = targets_N.subspan(size_t(r0), size_t(rows));
    const int64_t counted = count_targets(t);
    const Tensor n = n_ND.rows(r0, r1);
    if (counted == 0) {
      // No loss here: the rows' logits do not matter and their gradient is zero.
      if (grad) dn_ND.rows(r0, r1).zero();
      continue;
    }
    Tensor logits = Tensor::empty({rows, V}, dt);
    cpu::matmul_forward_mixed(logits, n, w_VD);
    if (!grad) {
      loss += cpu::cross_entropy_forward(logits, t) * double(counted) / double(count);
      continue;
    }
    // The kernel scales its gradient by dloss / counted: dloss = counted / count
    // makes it 1 / count, the batch mean's.
    Tensor dlogits = Tensor::empty({rows, V}, dt);
    const double share = double(counted) / double(count);
    loss += cpu::cross_entropy_forward_backward(dlogits, logits, t, share) * share;
    logits = Tensor();  // freed before the products below allocate
    Tensor dn = dn_ND.rows(r0, r1);
    cpu::matmul_backward_dx_mixed(dn, dlogits, w_VD);
    if (dw_VD.defined()) cpu::matmul_backward_dw(dw_VD, dlogits, n, /*accumulate=*/true);
  }
  return loss;
}

}  // namespace tiermoe
