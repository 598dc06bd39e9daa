// Rows in parallel. A row's exponentials are computed once into a scratch row
// and its reductions vectorize (so per-row losses differ from ref:: by ulps).
// Per-row losses are summed serially in row order, so the loss does not
// depend on the thread count.
#include "tiermoe/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../nn_common.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {

double cross_entropy(Tensor* dlogits_NV, const Tensor& logits_NV,
                     std::span<const int32_t> targets_N, double dloss, const char* op) {
  int64_t count = check_cross_entropy(logits_NV, targets_N, kIgnoreIndex, op);
  if (dlogits_NV) check_elementwise(*dlogits_NV, "dlogits_NV", logits_NV, "logits_NV", op);
  int64_t N = logits_NV.size(0), V = logits_NV.size(1);
  std::vector<double> row_loss(static_cast<size_t>(N), 0.0);
  visit_dtype(logits_NV.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    A scale = count ? A(dloss / double(count)) : A(0);
    const T* xs = logits_NV.data<T>();
    T* dxs = dlogits_NV ? dlogits_NV->data<T>() : nullptr;
    parallel_for(N, std::max<int64_t>(1, 8192 / std::max<int64_t>(V, 1)),
                 [&](int64_t begin, int64_t end) {
                   std::vector<A> e(dxs ? static_cast<size_t>(V) : 0);
                   for (int64_t t = begin; t < end; ++t) {
                     int32_t target = targets_N[size_t(t)];
                     if (target == kIgnoreIndex) {
                       if (dxs) std::fill_n(dxs + t * V, V, store<T>(0));
                       continue;
                     }
                     const T* x = xs + t * V;
                     A m = -INFINITY;
#pragma omp simd reduction(max : m)
                     for (int64_t v = 0; v < V; ++v) m = std::max(m, load(x[v]));
                     A sum = 0;
                     if (dxs) {
                       for (int64_t v = 0; v < V; ++v) e[size_t(v)] = std::exp(load(x[v]) - m);
#pragma omp simd reduction(+ : sum)
                       for (int64_t v = 0; v < V; ++v) sum += e[size_t(v)];
                     } else {
                       for (int64_t v = 0; v < V; ++v) sum += std::exp(load(x[v]) - m);
                     }
                     A log_prob = (load(x[target]) - m) - std::log(sum);
                     row_loss[size_t(t)] = double(-log_prob);
                     if (!dxs) continue;
                     T* dx = dxs + t * V;
                     for (int64_t v = 0; v < V; ++v) dx[v] = store<T>(e[size_t(v)] / sum * scale);
                     dx[target] = store<T>(e[size_t(target)] / sum * scale - scale);
                   }
                 });
  });
  double total = 0;
  for (double l : row_loss) total += l;
  return count ? total / double(count) : 0.0;
}

}  // namespace

double cross_entropy_forward(const Tensor& logits_NV, std::span<const int32_t> targets_N) {
  return cross_entropy(nullptr, logits_NV, targets_N, 1.0, "cross_entropy_forward");
}

double cross_entropy_forward_backward(Tensor& dlogits_NV, const Tensor& logits_NV,
                                      std::span<const int32_t> targets_N, double dloss) {
  return cross_entropy(&dlogits_NV, logits_NV, targets_N, dloss, "cross_entropy_forward_backward");
}

}  // namespace tiermoe::cpu
