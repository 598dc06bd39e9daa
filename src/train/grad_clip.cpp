#include "tiermoe/train/grad_clip.h"

#include <cmath>
#include <vector>

#include "tiermoe/core/parallel.h"

namespace tiermoe {

namespace {

// Squares are summed sequentially within fixed blocks, and blocks in order,
// so the result does not depend on how parallel_for splits the work.
constexpr int64_t kBlock = 1 << 12;

template <class T>
double sum_of_squares(const T* g, int64_t n) {
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(size_t(blocks), 0.0);
  parallel_for(blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      double s = 0;
      for (int64_t i = b * kBlock, e = std::min(n, i + kBlock); i < e; ++i) s += double(g[i]) * double(g[i]);
      partial[size_t(b)] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

double grad_sum_of_squares(const Parameter& p) {
  return visit_dtype(p.grad.dtype(), [&]<class T>() -> double {
    if constexpr (std::is_same_v<T, bf16>) {
      TIERMOE_ASSERT(false, "bf16 gradient for ", p.name);
      return 0;
    } else {
      return sum_of_squares(p.grad.data<T>(), p.grad.numel());
    }
  });
}

bool all_finite(const Tensor& g) {
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (!std::isfinite(g.get(i))) return false;
  }
  return true;
}

[[noreturn]] void throw_non_finite(std::span<const Parameter> params, double total) {
  for (const Parameter& p : params) {
    if (!all_finite(p.grad)) {
      throw Error(detail::str_of("non-finite gradient (NaN or Inf); global grad norm ", total),
                  p.name,
                  "the loss diverged or overflowed: lower the learning rate, enable gradient "
                  "clipping, or train in f32");
    }
  }
  throw Error(detail::str_of("the global grad norm overflowed (", total, ") though every gradient is finite"),
              "gradient clipping", "the gradients are enormous: lower the learning rate");
}

}  // namespace

double global_grad_norm(std::span<const Parameter> params) {
  double sum = 0;
  for (const Parameter& p : params) sum += grad_sum_of_squares(p);
  double total = std::sqrt(sum);
  if (!std::isfinite(total)) throw_non_finite(params, total);
  return total;
}

double clip_grad_norm(std::span<Parameter> params, double max_norm) {
  TIERMOE_CHECK(max_norm > 0 && !std::isnan(max_norm), detail::str_of("max norm ", max_norm),
                "gradient clipping", "use a positive max norm (e.g. 1.0), or skip clipping");
  double total = global_grad_norm(params);
  double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    for (Parameter& p : params) {
      visit_dtype(p.grad.dtype(), [&]<class T>() {
        if constexpr (!std::is_same_v<T, bf16>) {
          T* g = p.grad.data<T>();
          T c = T(coef);
          parallel_for(p.grad.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) g[i] *= c;
          });
        }
      });
    }
  }
  return total;
}

}  // namespace tiermoe
