#pragma once
// Shared test helpers: tensor comparison that names the worst element, random
// tensors, and f64 central finite differences for gradient checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "tiermoe/core/random.h"
#include "tiermoe/core/tensor.h"

namespace tiermoe::testing {

inline Tensor random_tensor(const Shape& shape, DType dtype, Rng& rng, double scale = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  fill_normal(t, rng, 0.0, scale);
  return t;
}

// Passes when |got - want| <= atol + rtol * |want| everywhere; on failure
// reports the worst element (index, both values) and how many failed.
inline ::testing::AssertionResult all_close(const Tensor& got, const Tensor& want, double rtol,
                                            double atol, const std::string& name = "tensor") {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure()
           << name << ": shape " << got.str() << " vs " << want.str();
  }
  int64_t worst = -1, bad = 0;
  double worst_excess = 0, max_abs = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want.get(i);
    double diff = std::abs(g - w);
    if (std::isnan(g) != std::isnan(w)) diff = INFINITY;
    if (std::isnan(g) && std::isnan(w)) diff = 0;
    max_abs = std::max(max_abs, diff);
    double excess = diff - (atol + rtol * std::abs(w));
    if (excess > 0) {
      ++bad;
      if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": " << bad << " of " << got.numel() << " elements differ; worst at flat "
         << worst << ": got " << got.get(worst) << ", want " << want.get(worst)
         << " (max abs diff " << max_abs << ", rtol " << rtol << ", atol " << atol << ")";
}

inline ::testing::AssertionResult bitwise_equal(const Tensor& got, const Tensor& want,
                                                const std::string& name = "tensor") {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure()
           << name << ": " << got.str() << " vs " << want.str();
  }
  const auto* a = static_cast<const unsigned char*>(got.raw());
  const auto* b = static_cast<const unsigned char*>(want.raw());
  size_t elem = dtype_size(got.dtype());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(a + i * elem, b + i * elem, elem) != 0) {
      return ::testing::AssertionFailure() << name << ": first difference at flat " << i
                                           << ": got " << got.get(i) << ", want " << want.get(i);
    }
  }
  return ::testing::AssertionSuccess();
}

// d loss / d param[i] by central differences, in f64. `loss` must read param.
inline double fd_derivative(const std::function<double()>& loss, Tensor& param, int64_t i,
                            double eps = 1e-6) {
  double saved = param.get(i);
  param.set(i, saved + eps);
  double up = loss();
  param.set(i, saved - eps);
  double down = loss();
  param.set(i, saved);
  return (up - down) / (2 * eps);
}

// Checks every element of `grad` (or `max_checks` of them, evenly spaced)
// against central differences of `loss` with respect to `param` (both f64).
inline ::testing::AssertionResult fd_check(const std::function<double()>& loss, Tensor& param,
                                           const Tensor& grad, const std::string& name,
                                           double rtol = 1e-6, double atol = 1e-8,
                                           int64_t max_checks = 64, double eps = 1e-6) {
  if (param.dtype() != DType::f64 || grad.dtype() != DType::f64) {
    return ::testing::AssertionFailure() << name << ": finite differences need f64";
  }
  int64_t n = param.numel();
  int64_t stride = std::max<int64_t>(1, n / std::max<int64_t>(1, max_checks));
  for (int64_t i = 0; i < n; i += stride) {
    double fd = fd_derivative(loss, param, i, eps);
    double an = grad.get(i);
    if (std::abs(fd - an) > atol + rtol * std::abs(fd)) {
      return ::testing::AssertionFailure() << name << "[" << i << "]: analytic " << an
                                           << ", finite difference " << fd;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tiermoe::testing
