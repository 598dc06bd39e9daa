#include "tiermoe/train/grad_clip.h"

#include <algorithm>
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

[[noreturn]] void throw_non_finite(std::span<const Parameter> params, double total,
                                   const Comm* comm) {
  for (const Parameter& p : params) {
    if (!all_finite(p.grad)) {
      throw Error(detail::str_of("non-finite gradient (NaN or Inf); global grad norm ", total),
                  p.name,
                  "the loss diverged or overflowed: lower the learning rate, enable gradient "
                  "clipping, or train in f32");
    }
  }
  if (comm && comm->size() > 1) {
    throw Error(detail::str_of("non-finite global grad norm (", total, "); rank ", comm->rank(),
                               "'s gradients are finite"),
                "gradient clipping", "another rank names the parameter");
  }
  throw Error(detail::str_of("the global grad norm overflowed (", total, ") though every gradient is finite"),
              "gradient clipping", "the gradients are enormous: lower the learning rate");
}

}  // namespace

double global_grad_norm(std::span<const Parameter> params, Comm* comm) {
  double sum = 0;
  // Expert e's sum is at [e - first]; this rank's experts are a contiguous range.
  int64_t first = -1, last = -1;
  for (const Parameter& p : params) {
    if (p.expert < 0) continue;
    first = first < 0 ? p.expert : std::min(first, p.expert);
    last = std::max(last, p.expert);
  }
  std::vector<double> by_expert(first < 0 ? 0 : size_t(last - first + 1), 0.0);
  for (const Parameter& p : params) {
    if (p.expert < 0) {
      sum += grad_sum_of_squares(p);
    } else {
      by_expert[size_t(p.expert - first)] += grad_sum_of_squares(p);
    }
  }
  if (comm && comm->size() > 1) {
    // Every rank holds as many experts, so the gather is rank (= expert) order.
    const std::vector<int64_t> counts =
        comm->allgather_value(int64_t(by_expert.size()), "grad norm expert count");
    TIERMOE_ASSERT(std::all_of(counts.begin(), counts.end(),
                               [&](int64_t c) { return c == int64_t(by_expert.size()); }),
                   "ranks hold different expert counts");
    std::vector<double> all(by_expert.size() * size_t(comm->size()));
    comm->allgather(by_expert.data(), by_expert.size() * sizeof(double), all.data(),
                    "grad norm per expert");
    by_expert = std::move(all);
  }
  for (double s : by_expert) sum += s;
  double total = std::sqrt(sum);
  if (!std::isfinite(total)) throw_non_finite(params, total, comm);
  return total;
}

double clip_grad_norm(std::span<Parameter> params, double max_norm, Comm* comm) {
  TIERMOE_CHECK(max_norm > 0 && !std::isnan(max_norm), detail::str_of("max norm ", max_norm),
                "gradient clipping", "use a positive max norm (e.g. 1.0), or skip clipping");
  double total = global_grad_norm(params, comm);
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
