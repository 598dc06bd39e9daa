#include "tiermoe/kernels/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "../nn_common.h"

namespace tiermoe::ref {

using namespace nn_detail;

namespace {

// Sums the per-row losses; with dlogits defined also writes the gradient.
double cross_entropy(Tensor* dlogits_NV, const Tensor& logits_NV,
                     std::span<const int32_t> targets_N, double dloss, const char* op) {
  int64_t count = check_cross_entropy(logits_NV, targets_N, kIgnoreIndex, op);
  if (dlogits_NV) check_elementwise(*dlogits_NV, "dlogits_NV", logits_NV, "logits_NV", op);
  int64_t N = logits_NV.size(0), V = logits_NV.size(1);
  double total = 0;
  visit_dtype(logits_NV.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    A scale = count ? A(dloss / double(count)) : A(0);
    for (int64_t t = 0; t < N; ++t) {
      int32_t target = targets_N[size_t(t)];
      if (target == kIgnoreIndex) {
        if (dlogits_NV) std::fill_n(dlogits_NV->data<T>() + t * V, V, store<T>(0));
        continue;
      }
      const T* x = logits_NV.data<T>() + t * V;
      A m = -INFINITY;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, load(x[v]));
      A sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(load(x[v]) - m);
      A log_prob = (load(x[target]) - m) - std::log(sum);
      total += double(-log_prob);
      if (!dlogits_NV) continue;
      T* dx = dlogits_NV->data<T>() + t * V;
      for (int64_t v = 0; v < V; ++v) {
        A p = std::exp(load(x[v]) - m) / sum;
        dx[v] = store<T>(p * scale - (v == target ? scale : A(0)));
      }
    }
  });
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

}  // namespace tiermoe::ref
