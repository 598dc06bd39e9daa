// The causal depthwise convolution and SiLU (kernels/causal_conv.h) with
// ref::'s operations in ref::'s order for every element: a block of channels
// per task (so a channel's weight gradient sums its tokens in ref::'s order),
// the taps widened once, and each token's row of channels in one pass the
// compiler vectorizes.
#include <algorithm>
#include <vector>

#include "../causal_conv_check.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cpu {

using namespace nn_detail;

namespace {

constexpr int64_t kChannelGrain = 256;

// w_CK widened and transposed: tap j's weights for every channel, [K, C].
template <class T>
std::vector<acc_t<T>> taps(const Tensor& w_CK, const ConvDims& d) {
  std::vector<acc_t<T>> w(static_cast<size_t>(d.K * d.C));
  for (int64_t c = 0; c < d.C; ++c) {
    for (int64_t j = 0; j < d.K; ++j) w[size_t(j * d.C + c)] = load(w_CK.data<T>()[c * d.K + j]);
  }
  return w;
}

// pre[c] for channels [c0, c1) of token t of row b, as ref::'s
// pre_activation: the taps in order, those before `first` skipped, rounded
// to T and widened.
template <class T>
void pre_row(acc_t<T>* pre, const T* x, const std::vector<acc_t<T>>& w, const ConvDims& d,
             int64_t b, int64_t t, int64_t first, int64_t c0, int64_t c1) {
  using A = acc_t<T>;
  std::fill(pre, pre + (c1 - c0), A(0));
  for (int64_t j = 0; j < d.K; ++j) {
    const int64_t s = t - d.K + 1 + j;
    if (s < first) continue;
    const T* xs = x + (b * d.T + s) * d.C;
    const A* wj = w.data() + j * d.C;
    for (int64_t c = c0; c < c1; ++c) pre[c - c0] += wj[c] * load(xs[c]);
  }
  for (int64_t c = 0; c < c1 - c0; ++c) pre[c] = load(store<T>(pre[c]));
}

}  // namespace

void causal_conv_silu_forward(Tensor& y, const Tensor& x, const Tensor& w_CK,
                              std::span<const int32_t> doc_start_BT) {
  const ConvDims d = check_conv(x, w_CK, doc_start_BT, "causal_conv_silu_forward");
  check_elementwise(y, "y", x, "x", "causal_conv_silu_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const std::vector<A> w = taps<T>(w_CK, d);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    parallel_for(d.C, kChannelGrain, [&](int64_t c0, int64_t c1) {
      std::vector<A> pre(static_cast<size_t>(c1 - c0));
      for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t t = 0; t < d.T; ++t) {
          pre_row<T>(pre.data(), xp, w, d, b, t, first_readable(doc_start_BT, b, t, d.T), c0, c1);
          T* yr = yp + (b * d.T + t) * d.C;
          for (int64_t c = c0; c < c1; ++c) yr[c] = store<T>(silu(pre[size_t(c - c0)]));
        }
      }
    });
  });
}

void causal_conv_silu_backward(Tensor& dx, Tensor& dw_CK, const Tensor& dy, const Tensor& x,
                               const Tensor& w_CK, std::span<const int32_t> doc_start_BT) {
  const ConvDims d = check_conv_backward(dx, dw_CK, dy, x, w_CK, doc_start_BT);
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    const std::vector<A> w = taps<T>(w_CK, d);
    const T *xp = x.data<T>(), *dyp = dy.data<T>();
    T* dxp = dx.data<T>();
    A* dwp = dw_CK.defined() ? dw_CK.data<A>() : nullptr;
    std::vector<A> dx_acc(static_cast<size_t>(x.numel()), A(0));
    parallel_for(d.C, kChannelGrain, [&](int64_t c0, int64_t c1) {
      const int64_t n = c1 - c0;
      std::vector<A> pre(static_cast<size_t>(n)), dpre(static_cast<size_t>(n));
      // This block's dw_CK tap-major, so that a token's row of channels adds
      // in one pass; each element still adds its tokens in ref::'s order,
      // onto what dw_CK held.
      std::vector<A> dw(static_cast<size_t>(d.K * n), A(0));
      if (dwp) {
        for (int64_t c = 0; c < n; ++c) {
          for (int64_t j = 0; j < d.K; ++j) dw[size_t(j * n + c)] = dwp[(c0 + c) * d.K + j];
        }
      }
      for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t t = 0; t < d.T; ++t) {
          const int64_t first = first_readable(doc_start_BT, b, t, d.T);
          pre_row<T>(pre.data(), xp, w, d, b, t, first, c0, c1);
          const T* dyr = dyp + (b * d.T + t) * d.C;
          for (int64_t c = 0; c < n; ++c)
            dpre[size_t(c)] = load(dyr[c0 + c]) * silu_grad(pre[size_t(c)]);
          for (int64_t j = 0; j < d.K; ++j) {
            const int64_t s = t - d.K + 1 + j;
            if (s < first) continue;
            const int64_t from = (b * d.T + s) * d.C;
            const A* wj = w.data() + j * d.C;
            A* dxr = dx_acc.data() + from;
            for (int64_t c = c0; c < c1; ++c) dxr[c] += wj[c] * dpre[size_t(c - c0)];
            if (!dwp) continue;
            const T* xs = xp + from;
            A* dwj = dw.data() + j * n;
            for (int64_t c = 0; c < n; ++c) dwj[c] += dpre[size_t(c)] * load(xs[c0 + c]);
          }
        }
      }
      if (dwp) {
        for (int64_t c = 0; c < n; ++c) {
          for (int64_t j = 0; j < d.K; ++j) dwp[(c0 + c) * d.K + j] = dw[size_t(j * n + c)];
        }
      }
    });
    parallel_for(x.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dxp[i] = store<T>(dx_acc[size_t(i)]);
    });
  });
}

}  // namespace tiermoe::cpu
