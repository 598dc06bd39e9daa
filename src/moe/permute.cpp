// permute / combine: the pure functions of a DispatchPlan, forward and backward.
#include <algorithm>
#include <cstring>
#include <vector>

#include "tiermoe/core/parallel.h"
#include "tiermoe/moe/dispatch.h"

namespace tiermoe {

namespace {

constexpr int64_t kRowGrain = 64;

void check_rows(const Tensor& t, int64_t rows, int64_t D, std::string_view name) {
  check_shape(t, {rows, D}, name);
}

// Score tensors hold fp32 or f64; these read/write them as the acc type.
template <class A>
A score_at(const Tensor& s, int64_t n) {
  if (s.dtype() == DType::f64) return A(s.data<double>()[n]);
  return A(s.data<float>()[n]);
}

}  // namespace

void permute_forward(Tensor& x_ND, const Tensor& x_TD, const DispatchPlan& plan) {
  const int64_t D = x_TD.size(1);
  check_rows(x_TD, plan.T, D, "permute_forward: x_TD");
  check_rows(x_ND, plan.N, D, "permute_forward: x_ND");
  check_same_dtype(x_ND, x_TD, "x_ND", "x_TD");
  const size_t row_bytes = size_t(D) * dtype_size(x_TD.dtype());
  const char* src = static_cast<const char*>(x_TD.raw());
  char* dst = static_cast<char*>(x_ND.raw());
  parallel_for(plan.N, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      int32_t t = plan.token_N[size_t(n)];
      if (t < 0) std::memset(dst + n * row_bytes, 0, row_bytes);
      else std::memcpy(dst + n * row_bytes, src + t * row_bytes, row_bytes);
    }
  });
}

void permute_backward(Tensor& dx_TD, const Tensor& dx_ND, const DispatchPlan& plan,
                      bool accumulate) {
  const int64_t D = dx_TD.size(1), K = plan.K;
  check_rows(dx_TD, plan.T, D, "permute_backward: dx_TD");
  check_rows(dx_ND, plan.N, D, "permute_backward: dx_ND");
  check_same_dtype(dx_TD, dx_ND, "dx_TD", "dx_ND");
  visit_dtype(dx_TD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* g = dx_ND.data<T>();
    T* out = dx_TD.data<T>();
    parallel_for(plan.T, 16, [&](int64_t begin, int64_t end) {
      std::vector<A> sum(static_cast<size_t>(D));
      for (int64_t t = begin; t < end; ++t) {
        T* o = out + t * D;
        for (int64_t d = 0; d < D; ++d) sum[size_t(d)] = accumulate ? load<T>(o[d]) : A(0);
        for (int64_t k = 0; k < K; ++k) {
          const T* row = g + plan.row_TK[size_t(t * K + k)] * D;
          for (int64_t d = 0; d < D; ++d) sum[size_t(d)] += load<T>(row[d]);
        }
        for (int64_t d = 0; d < D; ++d) o[d] = store<T>(sum[size_t(d)]);
      }
    });
  });
}

void combine_forward(Tensor& out_TD, const Tensor& y_ND, const DispatchPlan& plan, bool absorbed) {
  const int64_t D = out_TD.size(1), K = plan.K;
  check_rows(out_TD, plan.T, D, "combine_forward: out_TD");
  check_rows(y_ND, plan.N, D, "combine_forward: y_ND");
  check_same_dtype(out_TD, y_ND, "out_TD", "y_ND");
  visit_dtype(out_TD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* y = y_ND.data<T>();
    T* out = out_TD.data<T>();
    parallel_for(plan.T, 16, [&](int64_t begin, int64_t end) {
      std::vector<A> sum(static_cast<size_t>(D));
      for (int64_t t = begin; t < end; ++t) {
        std::fill(sum.begin(), sum.end(), A(0));
        for (int64_t k = 0; k < K; ++k) {
          int64_t n = plan.row_TK[size_t(t * K + k)];
          const T* row = y + n * D;
          if (absorbed) {
            for (int64_t d = 0; d < D; ++d) sum[size_t(d)] += load<T>(row[d]);
          } else {
            A s = score_at<A>(plan.score_N, n);
            for (int64_t d = 0; d < D; ++d) sum[size_t(d)] += s * load<T>(row[d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) out[t * D + d] = store<T>(sum[size_t(d)]);
      }
    });
  });
}

void combine_backward(Tensor& dy_ND, Tensor& dscore_N, const Tensor& dout_TD, const Tensor& y_ND,
                      const DispatchPlan& plan, bool absorbed) {
  const int64_t D = dout_TD.size(1);
  check_rows(dout_TD, plan.T, D, "combine_backward: dout_TD");
  check_rows(dy_ND, plan.N, D, "combine_backward: dy_ND");
  check_same_dtype(dy_ND, dout_TD, "dy_ND", "dout_TD");
  if (!absorbed) {
    check_rows(y_ND, plan.N, D, "combine_backward: y_ND");
    check_shape(dscore_N, {plan.N}, "combine_backward: dscore_N");
    check_same_dtype(dscore_N, plan.score_N, "dscore_N", "score_N");
  }
  visit_dtype(dout_TD.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const T* g = dout_TD.data<T>();
    T* dy = dy_ND.data<T>();
    parallel_for(plan.N, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        int32_t t = plan.token_N[size_t(n)];
        T* o = dy + n * D;
        if (t < 0) {
          std::memset(static_cast<void*>(o), 0, size_t(D) * sizeof(T));
          if (!absorbed) dscore_N.set(n, 0.0);
          continue;
        }
        const T* gt = g + int64_t(t) * D;
        if (absorbed) {
          std::memcpy(static_cast<void*>(o), gt, size_t(D) * sizeof(T));
          continue;
        }
        A s = score_at<A>(plan.score_N, n);
        const T* yn = y_ND.data<T>() + n * D;
        A dot = 0;
        for (int64_t d = 0; d < D; ++d) {
          dot += load<T>(gt[d]) * load<T>(yn[d]);
          o[d] = store<T>(s * load<T>(gt[d]));
        }
        dscore_N.set(n, double(dot));
      }
    });
  });
}

void scores_backward(Tensor& dweights_TK, const Tensor& dscore_N, const DispatchPlan& plan,
                     bool accumulate) {
  check_shape(dweights_TK, {plan.T, plan.K}, "scores_backward: dweights_TK");
  check_shape(dscore_N, {plan.N}, "scores_backward: dscore_N");
  check_same_dtype(dweights_TK, dscore_N, "dweights_TK", "dscore_N");
  for (int64_t i = 0; i < plan.T * plan.K; ++i) {
    double g = dscore_N.get(plan.row_TK[size_t(i)]);
    dweights_TK.set(i, accumulate ? dweights_TK.get(i) + g : g);
  }
}

}  // namespace tiermoe
