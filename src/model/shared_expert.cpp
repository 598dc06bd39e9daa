#include "tiermoe/model/shared_expert.h"

#include <cmath>

namespace tiermoe {

SharedExpert::SharedExpert(int64_t hidden, int64_t intermediate, bool gated, DType compute,
                           MatrixAlloc alloc)
    : mlp_(hidden, intermediate, compute, alloc), gated_(gated) {
  // Like a router, the [1, D] gate is always allocated (never bound in place).
  if (gated) gate_ = Linear::zeros(1, hidden, /*bias=*/false, compute, MatrixAlloc::zeroed);
}

Tensor SharedExpert::run(const Tensor& x_TD, SharedExpertSaved& saved) const {
  const int64_t T = x_TD.size(0), D = x_TD.size(1);
  const DType dt = x_TD.dtype();
  saved.clear();
  Tensor m_TD = Tensor::empty({T, D}, dt);
  mlp_.forward(m_TD, x_TD, saved.mlp);
  if (!gated_) return m_TD;
  saved.m_TD = m_TD;
  Tensor z_T1 = Tensor::empty({T, 1}, dt);
  gate_.forward(z_T1, x_TD);
  saved.s_T = Tensor::empty({T}, acc_dtype_for(dt));
  visit_dtype(dt, [&]<class X>() {
    using A = acc_t<X>;
    const X* z = z_T1.data<X>();
    A* s = saved.s_T.data<A>();
    for (int64_t t = 0; t < T; ++t) s[t] = A(1) / (A(1) + std::exp(-load<X>(z[t])));
  });
  return m_TD;
}

void SharedExpert::forward_add(Tensor& y_TD, const Tensor& x_TD, SharedExpertSaved& saved) const {
  const Tensor m_TD = run(x_TD, saved);
  if (!gated_) {
    add_inplace(y_TD, m_TD);
  } else {
    const int64_t T = x_TD.size(0), D = x_TD.size(1);
    visit_dtype(x_TD.dtype(), [&]<class X>() {
      using A = acc_t<X>;
      const X* m = m_TD.data<X>();
      const A* s = saved.s_T.data<A>();
      X* y = y_TD.data<X>();
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < D; ++d) {
          const X scaled = store<X>(s[t] * load<X>(m[t * D + d]));
          y[t * D + d] = store<X>(load<X>(y[t * D + d]) + load<X>(scaled));
        }
      }
    });
  }
  if (!keep_) {  // the input alone: backward replays the rest
    const Tensor x = saved.mlp.x_TD;
    saved.clear();
    saved.mlp.x_TD = x;
  }
}

void SharedExpert::backward_add(Tensor& dx_TD, const Tensor& dy_TD, const SharedExpertSaved& kept) {
  SharedExpertSaved replayed;
  const bool replay = !kept.mlp.h_T2I.defined();
  if (replay) run(kept.mlp.x_TD, replayed);
  const SharedExpertSaved& saved = replay ? replayed : kept;
  if (!gated_) {
    mlp_.backward(dx_TD, dy_TD, saved.mlp, /*accumulate=*/true);
    return;
  }
  const int64_t T = dy_TD.size(0), D = dy_TD.size(1);
  const DType dt = dy_TD.dtype();
  // y = s * m: dm = s * dy, and through s = sigmoid(z): dz = s (1 - s) (dy . m).
  Tensor dm_TD = Tensor::empty({T, D}, dt);
  Tensor dz_T1 = Tensor::empty({T, 1}, dt);
  visit_dtype(dt, [&]<class X>() {
    using A = acc_t<X>;
    const X* dy = dy_TD.data<X>();
    const X* m = saved.m_TD.data<X>();
    const A* s = saved.s_T.data<A>();
    X* dm = dm_TD.data<X>();
    X* dz = dz_T1.data<X>();
    for (int64_t t = 0; t < T; ++t) {
      A dot = 0;
      for (int64_t d = 0; d < D; ++d) {
        const A g = load<X>(dy[t * D + d]);
        dot += g * load<X>(m[t * D + d]);
        dm[t * D + d] = store<X>(s[t] * g);
      }
      dz[t] = store<X>(s[t] * (A(1) - s[t]) * dot);
    }
  });
  mlp_.backward(dx_TD, dm_TD, saved.mlp, /*accumulate=*/true);
  gate_.backward(dx_TD, dz_T1, saved.mlp.x_TD, /*accumulate=*/true);
}

}  // namespace tiermoe
