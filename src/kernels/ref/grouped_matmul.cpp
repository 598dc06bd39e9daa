// The oracle of the grouped products: each group's rows through ref::matmul_*
// on the weight the group was packed from (widened to the products' dtype),
// then the bias, GLU and score one step at a time in plain loops.
#include "tiermoe/kernels/grouped_matmul.h"

#include <algorithm>
#include <cmath>

#include "../grouped_check.h"
#include "../nn_common.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe::ref {
namespace {

bool runs(const std::vector<int64_t>& offset_G, std::span<const uint8_t> skip_G, int64_t g) {
  return (skip_G.empty() || !skip_G[size_t(g)]) && offset_G[size_t(g) + 1] > offset_G[size_t(g)];
}

Tensor weight_of(const PackedWeights& w, int64_t g) {
  if (w.quantized()) return dequantize(w.quant_source(g), w.dtype());
  const Tensor& w_NK = w.source(g);
  return w_NK.dtype() == w.dtype() ? w_NK : w_NK.to(w.dtype());
}

// y_MO = T(y + b) or T(y + s * b), per row.
template <class T>
void add_bias(Tensor& y_MO, const T* b, const Tensor& score_N, int64_t row0) {
  const int64_t M = y_MO.size(0), O = y_MO.size(1);
  T* y = y_MO.data<T>();
  for (int64_t m = 0; m < M; ++m) {
    const float s = score_N.defined() ? detail::score_f32(score_N, row0 + m) : 1.f;
    for (int64_t o = 0; o < O; ++o) {
      const float bias = load<T>(b[o]);
      y[m * O + o] = store<T>(load<T>(y[m * O + o]) + (score_N.defined() ? s * bias : bias));
    }
  }
}

template <class T>
void glu(Tensor& a_MF, const Tensor& h_M2F, const Glu& g) {
  const int64_t M = a_MF.size(0), F = a_MF.size(1);
  const T* h = h_M2F.data<T>();
  T* a = a_MF.data<T>();
  const float alpha = float(g.alpha), limit = float(g.limit);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t f = 0; f < F; ++f) {
      if (g.kind == GluKind::swiglu) {
        const float gate = load<T>(h[m * 2 * F + f]), up = load<T>(h[m * 2 * F + F + f]);
        a[m * F + f] = store<T>(nn_detail::silu(gate) * up);
      } else {
        const float gate = std::min(load<T>(h[m * 2 * F + 2 * f]), limit);
        const float up = std::clamp(load<T>(h[m * 2 * F + 2 * f + 1]), -limit, limit);
        const float sig = 1.f / (1.f + std::exp(-(alpha * gate)));
        a[m * F + f] = store<T>((up + 1.f) * (gate * sig));
      }
    }
  }
}

}  // namespace

void grouped_matmul(Tensor& y_NO, const Tensor& x_NI, const std::vector<int64_t>& offset_G,
                    const PackedWeights& w, const Tensor& bias_GO, const Tensor& score_N,
                    std::span<const uint8_t> skip_G) {
  detail::check_grouped_matmul(y_NO, x_NI, offset_G, w, bias_GO, score_N, skip_G);
  const bool dx = w.use() == PackUse::backward_dx;
  const DType dt = w.dtype();
  for (int64_t g = 0; g < w.groups(); ++g) {
    if (!runs(offset_G, skip_G, g)) continue;
    const int64_t b = offset_G[size_t(g)], e = offset_G[size_t(g) + 1];
    Tensor y = y_NO.rows(b, e);
    const Tensor x = x_NI.rows(b, e), w_g = weight_of(w, g);
    if (dx) {
      matmul_backward_dx(y, x, w_g);
    } else {
      matmul_forward(y, x, w_g);
    }
    if (bias_GO.defined()) {
      visit_dtype(dt, [&]<class T>() {
        if constexpr (!std::is_same_v<T, double>) {
          add_bias(y, bias_GO.data<T>() + g * bias_GO.size(1), score_N, b);
        }
      });
    }
  }
}

void grouped_glu_forward(Tensor& h_N2F, Tensor& a_NF, Tensor& as_NF, const Tensor& x_ND,
                         const std::vector<int64_t>& offset_G, const PackedWeights& w13,
                         const Tensor& b13_G2F, const Tensor& score_N,
                         std::span<const uint8_t> skip_G) {
  detail::check_grouped_glu_forward(h_N2F, a_NF, as_NF, x_ND, offset_G, w13, b13_G2F, score_N,
                                    skip_G);
  const int64_t F = w13.out_features() / 2;
  const DType dt = w13.dtype();
  for (int64_t g = 0; g < w13.groups(); ++g) {
    if (!runs(offset_G, skip_G, g)) continue;
    const int64_t b = offset_G[size_t(g)], e = offset_G[size_t(g) + 1];
    Tensor h = h_N2F.rows(b, e), a = a_NF.rows(b, e);
    matmul_forward(h, x_ND.rows(b, e), weight_of(w13, g));
    visit_dtype(dt, [&]<class T>() {
      if constexpr (!std::is_same_v<T, double>) {
        if (b13_G2F.defined()) add_bias(h, b13_G2F.data<T>() + g * 2 * F, Tensor(), b);
        glu<T>(a, h, w13.glu());
        if (!score_N.defined()) return;
        const T* ap = a.data<T>();
        T* out = as_NF.data<T>() + b * F;
        for (int64_t m = 0; m < e - b; ++m) {
          const float s = detail::score_f32(score_N, b + m);
          for (int64_t f = 0; f < F; ++f) out[m * F + f] = store<T>(load<T>(ap[m * F + f]) * s);
        }
      }
    });
  }
}

}  // namespace tiermoe::ref
