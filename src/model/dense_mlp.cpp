#include "tiermoe/model/dense_mlp.h"

#include "tiermoe/kernels/activation.h"

namespace tiermoe {

DenseMlp::DenseMlp(int64_t hidden, int64_t intermediate, DType compute, MatrixAlloc alloc)
    : I_(intermediate),
      compute_(compute),
      w13_(Linear::zeros(2 * intermediate, hidden, false, compute, alloc)),
      down_(Linear::zeros(hidden, intermediate, false, compute, alloc)) {}

void DenseMlp::enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) {
  const int64_t D = w13_.in_features();
  const DType dt = compute_;
  auto make = [&](const char* name, int64_t in, int64_t out) -> std::unique_ptr<LoraAdapter> {
    if (!lora_targets_module(config, prefix + name)) return nullptr;
    auto a = std::make_unique<LoraAdapter>(in, out, config, dt, prefix + name);
    a->init(rng);
    return a;
  };
  lora_gate_ = make("gate_proj", D, I_);
  lora_up_ = make("up_proj", D, I_);
  lora_down_ = make("down_proj", I_, D);
}

std::vector<LoraAdapter*> DenseMlp::lora_adapters() {
  std::vector<LoraAdapter*> out;
  for (auto* a : {&lora_gate_, &lora_up_, &lora_down_}) {
    if (*a) out.push_back(a->get());
  }
  return out;
}

namespace {

Tensor lora_u(const LoraAdapter& a, int64_t T) {
  return Tensor::empty({T, a.rank()}, lora_master_dtype(a.compute_dtype()));
}

}  // namespace

void DenseMlp::forward(Tensor& y_TD, const Tensor& x_TD, DenseMlpSaved& saved) const {
  const int64_t T = x_TD.size(0);
  const DType dt = x_TD.dtype();
  saved.clear();
  saved.x_TD = x_TD;
  saved.h_T2I = Tensor::empty({T, 2 * I_}, dt);
  saved.a_TI = Tensor::empty({T, I_}, dt);
  w13_.forward(saved.h_T2I, x_TD);
  if (lora_gate_) {
    saved.u_gate_TR = lora_u(*lora_gate_, T);
    lora_gate_->forward(saved.h_T2I, saved.u_gate_TR, x_TD, {0, 1});
  }
  if (lora_up_) {
    saved.u_up_TR = lora_u(*lora_up_, T);
    lora_up_->forward(saved.h_T2I, saved.u_up_TR, x_TD, {I_, 1});
  }
  cpu::swiglu_forward(saved.a_TI, saved.h_T2I);
  down_.forward(y_TD, saved.a_TI);
  if (lora_down_) {
    saved.u_down_TR = lora_u(*lora_down_, T);
    lora_down_->forward(y_TD, saved.u_down_TR, saved.a_TI);
  }
}

void DenseMlp::backward(Tensor& dx_TD, const Tensor& dy_TD, const DenseMlpSaved& saved,
                        bool accumulate) {
  const int64_t T = dy_TD.size(0);
  const DType dt = dy_TD.dtype();
  Tensor da_TI = Tensor::empty({T, I_}, dt);
  down_.backward(da_TI, dy_TD, saved.a_TI);
  if (lora_down_) lora_down_->backward(da_TI, dy_TD, saved.a_TI, saved.u_down_TR);
  Tensor dh_T2I = Tensor::empty({T, 2 * I_}, dt);
  cpu::swiglu_backward(dh_T2I, da_TI, saved.h_T2I);
  w13_.backward(dx_TD, dh_T2I, saved.x_TD, accumulate);
  if (lora_gate_) lora_gate_->backward(dx_TD, dh_T2I, saved.x_TD, saved.u_gate_TR, {0, 1});
  if (lora_up_) lora_up_->backward(dx_TD, dh_T2I, saved.x_TD, saved.u_up_TR, {I_, 1});
}

}  // namespace tiermoe
