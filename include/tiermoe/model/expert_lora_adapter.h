#pragma once
// ExpertLora (model/lora.h) seen through moe's ExpertAdapter, so that
// GroupedExperts calls it at its fixed points. The experts' fused W13 output
// holds gate_proj's columns [0, F) and up_proj's [F, 2F) under swiglu, and
// interleaves them under gpt-oss's GLU (gate at even columns, up at odd);
// down_proj adapts W2's whole output. MoeBlock hooks its experts' LoRA with
// it, and the Python package hooks PEFT's expert adapters the same way.
#include <cstdint>

#include "tiermoe/model/lora.h"
#include "tiermoe/moe/experts.h"

namespace tiermoe {

class ExpertLoraAdapter final : public ExpertAdapter {
 public:
  ExpertLoraAdapter(ExpertLora& lora, const ExpertsConfig& experts, DType compute)
      : lora_(&lora),
        ffn_(experts.ffn),
        interleaved_(experts.activation == ExpertActivation::gpt_oss),
        dtype_(lora_master_dtype(compute)) {}

  bool adapts(ExpertLinear p) const override { return lora_->has(proj(p)); }
  int64_t rank() const override { return lora_->rank(); }
  DType dtype() const override { return dtype_; }
  void forward_rows(ExpertLinear p, int64_t e, Tensor& y_MY, Tensor& u_MR,
                    const Tensor& x_MI) const override {
    lora_->forward_rows(proj(p), e, y_MY, u_MR, x_MI, columns(p));
  }
  void backward_rows(ExpertLinear p, int64_t e, Tensor& dx_MI, const Tensor& dy_MY,
                     const Tensor& x_MI, const Tensor& u_MR) override {
    lora_->backward_rows(proj(p), e, dx_MI, dy_MY, x_MI, u_MR, columns(p));
  }

 private:
  static ExpertProj proj(ExpertLinear p) {
    switch (p) {
      case ExpertLinear::gate: return ExpertProj::gate;
      case ExpertLinear::up: return ExpertProj::up;
      case ExpertLinear::down: return ExpertProj::down;
    }
    __builtin_unreachable();
  }
  LoraColumns columns(ExpertLinear p) const {
    switch (p) {
      case ExpertLinear::gate: return interleaved_ ? LoraColumns{0, 2} : LoraColumns{};
      case ExpertLinear::up: return interleaved_ ? LoraColumns{1, 2} : LoraColumns{ffn_, 1};
      case ExpertLinear::down: return {};
    }
    __builtin_unreachable();
  }

  ExpertLora* lora_;
  int64_t ffn_;
  bool interleaved_;
  DType dtype_;
};

}  // namespace tiermoe
