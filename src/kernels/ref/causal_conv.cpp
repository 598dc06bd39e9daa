// The causal depthwise convolution and SiLU, plainly (kernels/causal_conv.h).
#include "tiermoe/kernels/causal_conv.h"

#include "../causal_conv_check.h"

namespace tiermoe::ref {

using namespace nn_detail;

namespace {

template <class T>
acc_t<T> pre_activation(const Tensor& x, const Tensor& w_CK, const ConvDims& d,
                        std::span<const int32_t> doc_start_BT, int64_t b, int64_t t, int64_t c) {
  using A = acc_t<T>;
  const int64_t first = first_readable(doc_start_BT, b, t, d.T);
  A acc = 0;
  for (int64_t j = 0; j < d.K; ++j) {
    const int64_t s = t - d.K + 1 + j;
    if (s < first) continue;
    acc += load(w_CK.data<T>()[c * d.K + j]) * load(x.data<T>()[(b * d.T + s) * d.C + c]);
  }
  return load(store<T>(acc));
}

}  // namespace

void causal_conv_silu_forward(Tensor& y, const Tensor& x, const Tensor& w_CK,
                              std::span<const int32_t> doc_start_BT) {
  const ConvDims d = check_conv(x, w_CK, doc_start_BT, "causal_conv_silu_forward");
  check_elementwise(y, "y", x, "x", "causal_conv_silu_forward");
  visit_dtype(x.dtype(), [&]<class T>() {
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t t = 0; t < d.T; ++t) {
        for (int64_t c = 0; c < d.C; ++c) {
          const auto pre = pre_activation<T>(x, w_CK, d, doc_start_BT, b, t, c);
          y.data<T>()[(b * d.T + t) * d.C + c] = store<T>(silu(pre));
        }
      }
    }
  });
}

void causal_conv_silu_backward(Tensor& dx, Tensor& dw_CK, const Tensor& dy, const Tensor& x,
                               const Tensor& w_CK, std::span<const int32_t> doc_start_BT) {
  const ConvDims d = check_conv_backward(dx, dw_CK, dy, x, w_CK, doc_start_BT);
  visit_dtype(x.dtype(), [&]<class T>() {
    using A = acc_t<T>;
    std::vector<A> dx_acc(size_t(x.numel()), A(0));
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t first = first_readable(doc_start_BT, b, t, d.T);
        for (int64_t c = 0; c < d.C; ++c) {
          const int64_t at = (b * d.T + t) * d.C + c;
          const A pre = pre_activation<T>(x, w_CK, d, doc_start_BT, b, t, c);
          const A dpre = load(dy.data<T>()[at]) * silu_grad(pre);
          for (int64_t j = 0; j < d.K; ++j) {
            const int64_t s = t - d.K + 1 + j;
            if (s < first) continue;
            const int64_t from = (b * d.T + s) * d.C + c;
            dx_acc[size_t(from)] += load(w_CK.data<T>()[c * d.K + j]) * dpre;
            if (dw_CK.defined()) dw_CK.data<A>()[c * d.K + j] += dpre * load(x.data<T>()[from]);
          }
        }
      }
    }
    for (int64_t i = 0; i < x.numel(); ++i) dx.data<T>()[i] = store<T>(dx_acc[size_t(i)]);
  });
}

}  // namespace tiermoe::ref
