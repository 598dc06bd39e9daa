#include "tiermoe/model/decoder_layer.h"

#include <optional>

#include "tiermoe/core/timer.h"
#include "tiermoe/kernels/rmsnorm.h"

namespace tiermoe {

DecoderLayer::DecoderLayer(const ModelConfig& c, int64_t layer, DType compute,
                           const Dispatcher& dispatcher, MatrixAlloc alloc)
    : layer_(layer),
      prefix_("model.layers." + std::to_string(layer) + "."),
      attention_name_(prefix_ + std::string(c.attention_module(layer))),
      mlp_name_(prefix_ + std::string(c.is_moe_layer(layer) ? c.spec().moe_block : "mlp")),
      eps_(c.rms_norm_eps),
      norm_cast_(rmsnorm_cast(c)),
      norm_in_(Weight::zeros({c.hidden_size}, compute)),
      norm_post_(Weight::zeros({c.hidden_size}, compute)),
      attn_(make_self_attention(c, layer, compute, alloc)) {
  if (c.is_moe_layer(layer)) {
    moe_ = std::make_unique<MoeBlock>(c, compute, dispatcher, mlp_name_, alloc);
    if (c.has_shared_expert()) {
      shared_name_ = mlp_name_ + "." + std::string(c.spec().shared_expert);
      shared_ = std::make_unique<SharedExpert>(c.hidden_size, c.shared_expert_intermediate_size,
                                               c.shared_expert_gated(), compute, alloc);
    }
  } else {
    mlp_ = std::make_unique<DenseMlp>(c.hidden_size, c.intermediate_size, compute, alloc);
  }
}

void DecoderLayer::enable_lora(const LoraConfig& config, Rng& rng) {
  attn_->enable_lora(config, attention_name_ + ".", rng);
  if (mlp_) {
    mlp_->enable_lora(config, mlp_name_ + ".", rng);
  } else {
    if (shared_) shared_->enable_lora(config, shared_name_ + ".", rng);
    moe_->enable_lora(config, rng);
  }
}

void DecoderLayer::set_step_times(StepTimes* times) {
  step_times_ = times;
  attn_->set_step_times(times);
  if (moe_) moe_->layer().set_step_times(times);
}

std::vector<LoraAdapter*> DecoderLayer::lora_adapters() {
  std::vector<LoraAdapter*> out = attn_->lora_adapters();
  if (mlp_) {
    for (LoraAdapter* a : mlp_->lora_adapters()) out.push_back(a);
  }
  if (shared_) {
    for (LoraAdapter* a : shared_->lora_adapters()) out.push_back(a);
  }
  return out;
}

Tensor DecoderLayer::forward(const Tensor& x_TD, const RopeTables& rope, DecoderLayerSaved& saved,
                             bool weight_grads) {
  const int64_t T = x_TD.size(0), D = x_TD.size(1);
  const DType dt = x_TD.dtype();
  saved.x_TD = x_TD;
  saved.rstd_in_T = Tensor::empty({T}, acc_dtype_for(dt));
  Tensor n_TD = Tensor::empty({T, D}, dt);
  timed(step_times_, StepPart::norms, [&] {
    cpu::rmsnorm_forward(n_TD, saved.rstd_in_T, x_TD, norm_in_.value, eps_, norm_cast_);
  });
  Tensor h_TD = Tensor::empty({T, D}, dt);
  auto t0 = Clock::now();
  attn_->forward(h_TD, n_TD, rope, saved.attn);
  times_.attention_s += seconds_since(t0);
  saved.h_TD = h_TD;
  saved.rstd_post_T = Tensor::empty({T}, acc_dtype_for(dt));
  Tensor m_TD = Tensor::empty({T, D}, dt);
  timed(step_times_, StepPart::norms, [&] {
    add_inplace(h_TD, x_TD);
    // The guard runs on the residual stream: the input was finite, so a
    // non-finite value here came from this half (before a router sees it).
    check_finite_activation(h_TD, attention_name_ + " output");
    cpu::rmsnorm_forward(m_TD, saved.rstd_post_T, h_TD, norm_post_.value, eps_, norm_cast_);
  });
  Tensor out_TD;
  t0 = Clock::now();
  if (moe_) {
    out_TD = moe_->forward(m_TD, saved.moe, weight_grads);
    if (shared_) {
      timed(step_times_, StepPart::projections,
            [&] { shared_->forward_add(out_TD, m_TD, saved.shared); });
    }
  } else {
    out_TD = Tensor::empty({T, D}, dt);
    timed(step_times_, StepPart::projections, [&] { mlp_->forward(out_TD, m_TD, saved.mlp); });
  }
  times_.mlp_s += seconds_since(t0);
  timed(step_times_, StepPart::norms, [&] {
    add_inplace(out_TD, h_TD);
    check_finite_activation(out_TD, mlp_name_ + " output");
  });
  return out_TD;
}

void DecoderLayer::backward(Tensor& dx_TD, const Tensor& dout_TD, const RopeTables& rope,
                            DecoderLayerSaved& saved, const Tensor& dlogits_extra_TE) {
  const int64_t T = dout_TD.size(0), D = dout_TD.size(1);
  const DType dt = dout_TD.dtype();
  // out = h + mlp(norm_post(h))
  Tensor dm_TD = Tensor::empty({T, D}, dt);
  auto t0 = Clock::now();
  if (moe_) {
    moe_->backward(dm_TD, dout_TD, saved.moe, dlogits_extra_TE);
    if (shared_) {
      timed(step_times_, StepPart::projections,
            [&] { shared_->backward_add(dm_TD, dout_TD, saved.shared); });
    }
  } else {
    timed(step_times_, StepPart::projections, [&] { mlp_->backward(dm_TD, dout_TD, saved.mlp); });
  }
  times_.mlp_s += seconds_since(t0);
  std::optional<TimedPart> part(std::in_place, step_times_, StepPart::norms);
  Tensor dh_TD = dout_TD.clone();
  Tensor dw_post = norm_post_.grad_sink();
  cpu::rmsnorm_backward(dh_TD, dw_post, dm_TD, saved.h_TD, norm_post_.value, saved.rstd_post_T,
                        /*accumulate=*/true, norm_cast_);
  part.reset();
  // h = x + attn(norm_in(x))
  Tensor dn_TD = Tensor::empty({T, D}, dt);
  t0 = Clock::now();
  attn_->backward(dn_TD, dh_TD, rope, saved.attn, /*accumulate=*/false);
  times_.attention_s += seconds_since(t0);
  part.emplace(step_times_, StepPart::norms);
  dx_TD.copy_from(dh_TD);
  Tensor dw_in = norm_in_.grad_sink();
  cpu::rmsnorm_backward(dx_TD, dw_in, dn_TD, saved.x_TD, norm_in_.value, saved.rstd_in_T,
                        /*accumulate=*/true, norm_cast_);
}

}  // namespace tiermoe
