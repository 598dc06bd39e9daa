#include "tiermoe/model/dense_mlp.h"

#include "tiermoe/kernels/activation.h"

namespace tiermoe {

DenseMlp::DenseMlp(int64_t hidden, int64_t intermediate, DType compute)
    : I_(intermediate),
      w13_(Linear::zeros(2 * intermediate, hidden, false, compute)),
      down_(Linear::zeros(hidden, intermediate, false, compute)) {}

void DenseMlp::forward(Tensor& y_TD, const Tensor& x_TD, DenseMlpSaved& saved) const {
  const int64_t T = x_TD.size(0);
  const DType dt = x_TD.dtype();
  saved.clear();
  saved.x_TD = x_TD;
  saved.h_T2I = Tensor::empty({T, 2 * I_}, dt);
  saved.a_TI = Tensor::empty({T, I_}, dt);
  w13_.forward(saved.h_T2I, x_TD);
  cpu::swiglu_forward(saved.a_TI, saved.h_T2I);
  down_.forward(y_TD, saved.a_TI);
}

void DenseMlp::backward(Tensor& dx_TD, const Tensor& dy_TD, const DenseMlpSaved& saved,
                        bool accumulate) {
  const int64_t T = dy_TD.size(0);
  const DType dt = dy_TD.dtype();
  Tensor da_TI = Tensor::empty({T, I_}, dt);
  down_.backward(da_TI, dy_TD, saved.a_TI);
  Tensor dh_T2I = Tensor::empty({T, 2 * I_}, dt);
  cpu::swiglu_backward(dh_T2I, da_TI, saved.h_T2I);
  w13_.backward(dx_TD, dh_T2I, saved.x_TD, accumulate);
}

}  // namespace tiermoe
