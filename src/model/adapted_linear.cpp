#include "tiermoe/model/adapted_linear.h"

namespace tiermoe {

void adapted_forward(const Linear& proj, const LoraAdapter* lora, Tensor& y_MO, Tensor& u_MR,
                     const Tensor& x_MI) {
  proj.forward(y_MO, x_MI);
  if (!lora) return;
  u_MR = Tensor::empty({x_MI.size(0), lora->rank()}, lora_master_dtype(lora->compute_dtype()));
  lora->forward(y_MO, u_MR, x_MI);
}

void adapted_backward(Linear& proj, LoraAdapter* lora, Tensor& dx_MI, const Tensor& dy_MO,
                      const Tensor& x_MI, const Tensor& u_MR, bool accumulate) {
  proj.backward(dx_MI, dy_MO, x_MI, accumulate);
  if (lora) lora->backward(dx_MI, dy_MO, x_MI, u_MR);
}

std::unique_ptr<LoraAdapter> adapter_for(const Linear& proj, const LoraConfig& config,
                                         const std::string& path, DType compute, Rng& rng) {
  if (!lora_targets_module(config, path)) return nullptr;
  auto a =
      std::make_unique<LoraAdapter>(proj.in_features(), proj.out_features(), config, compute, path);
  a->init(rng);
  return a;
}

}  // namespace tiermoe
