#include "tiermoe/model/attention_block.h"

#include <optional>

#include "column_copy.h"
#include "tiermoe/kernels/activation.h"
#include "tiermoe/kernels/attention.h"
#include "tiermoe/kernels/rmsnorm.h"
#include "tiermoe/kernels/rope.h"

namespace tiermoe {

AttentionBlock::AttentionBlock(const ModelConfig& c, int64_t layer, DType compute,
                               MatrixAlloc alloc)
    : qk_norm_(c.qk_norm()),
      norm_cast_(rmsnorm_cast(c)),
      output_gate_(c.spec().attention_output_gate),
      compute_(compute),
      H_(c.num_attention_heads),
      Hkv_(c.num_key_value_heads),
      P_(c.head_dim),
      eps_(c.rms_norm_eps),
      window_(c.attention_window(layer)) {
  const int64_t D = c.hidden_size;
  q_proj_ = Linear::zeros((output_gate_ ? 2 : 1) * H_ * P_, D, c.q_k_v_bias(), compute, alloc);
  k_proj_ = Linear::zeros(Hkv_ * P_, D, c.q_k_v_bias(), compute, alloc);
  v_proj_ = Linear::zeros(Hkv_ * P_, D, c.q_k_v_bias(), compute, alloc);
  o_proj_ = Linear::zeros(D, H_ * P_, c.attention_bias, compute, alloc);
  if (qk_norm_ == QkNorm::per_head) {
    q_norm_ = Weight::zeros({P_}, compute);
    k_norm_ = Weight::zeros({P_}, compute);
  } else if (qk_norm_ == QkNorm::whole) {
    q_norm_ = Weight::zeros({H_ * P_}, compute);
    k_norm_ = Weight::zeros({Hkv_ * P_}, compute);
  }
  if (c.spec().attention_sinks) sinks_ = Weight::zeros({H_}, compute);
}

std::vector<std::pair<std::string, Weight*>> AttentionBlock::weights() {
  std::vector<std::pair<std::string, Weight*>> out = {{"q_proj.weight", &q_proj_.weight},
                                                      {"k_proj.weight", &k_proj_.weight},
                                                      {"v_proj.weight", &v_proj_.weight},
                                                      {"o_proj.weight", &o_proj_.weight}};
  if (q_proj_.bias.value.defined()) {
    out.push_back({"q_proj.bias", &q_proj_.bias});
    out.push_back({"k_proj.bias", &k_proj_.bias});
    out.push_back({"v_proj.bias", &v_proj_.bias});
  }
  if (o_proj_.bias.value.defined()) out.push_back({"o_proj.bias", &o_proj_.bias});
  if (qk_norm_ != QkNorm::none) {
    out.push_back({"q_norm.weight", &q_norm_});
    out.push_back({"k_norm.weight", &k_norm_});
  }
  if (sinks_.value.defined()) out.push_back({"sinks", &sinks_});
  return out;
}

void AttentionBlock::enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) {
  const char* names[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
  const Linear* projs[4] = {&q_proj_, &k_proj_, &v_proj_, &o_proj_};
  for (int i = 0; i < 4; ++i)
    lora_[i] = adapter_for(*projs[i], config, prefix + names[i], compute_, rng);
}

std::vector<LoraAdapter*> AttentionBlock::lora_adapters() {
  std::vector<LoraAdapter*> out;
  for (auto& a : lora_) {
    if (a) out.push_back(a.get());
  }
  return out;
}

namespace {

// The rows the q/k norm runs over: one row per head (P values) or per token.
Tensor norm_rows(const Tensor& t_TX, QkNorm mode, int64_t P) {
  return mode == QkNorm::per_head ? t_TX.view({t_TX.numel() / P, P}) : t_TX;
}

// The output gate's q_proj gives each head [q | gate], P values each: the
// query and gate columns apart ([N, H*P] each), and back together.
void split_query_gate(Tensor& q_TX, Tensor& gate_TX, const Tensor& qg_TX, int64_t P) {
  copy_block(q_TX, P, 0, qg_TX, 2 * P, 0, P);
  copy_block(gate_TX, P, 0, qg_TX, 2 * P, P, P);
}
void join_query_gate(Tensor& qg_TX, const Tensor& q_TX, const Tensor& gate_TX, int64_t P) {
  copy_block(qg_TX, 2 * P, 0, q_TX, P, 0, P);
  copy_block(qg_TX, 2 * P, P, gate_TX, P, 0, P);
}

}  // namespace

AttentionOptions AttentionBlock::attention_options(const RopeTables& rope) const {
  return {.doc_start_BT = rope.doc_start_BT,
          .window = window_,
          .sinks_H = sinks_.value.defined() ? &sinks_.value : nullptr};
}

void AttentionBlock::forward(Tensor& y_TD, const Tensor& x_TD, const RopeTables& rope,
                             AttentionSaved& saved) const {
  const int64_t B = rope.B, T = rope.T, N = B * T;
  const DType dt = x_TD.dtype();
  TIERMOE_ASSERT(x_TD.size(0) == N, x_TD.str(), " for B ", B, " T ", T);
  saved.clear();
  saved.x_TD = x_TD;

  Tensor q = Tensor::empty({N, H_ * P_}, dt), k = Tensor::empty({N, Hkv_ * P_}, dt);
  Tensor v = Tensor::empty({N, Hkv_ * P_}, dt);
  std::optional<TimedPart> part(std::in_place, times_, StepPart::projections);
  if (output_gate_) {
    Tensor qg = Tensor::empty({N, 2 * H_ * P_}, dt);
    adapted_forward(q_proj_, lora_[0].get(), qg, saved.u_TR[0], x_TD);
    saved.z = Tensor::empty({N, H_ * P_}, dt);
    split_query_gate(q, saved.z, qg, P_);
  } else {
    adapted_forward(q_proj_, lora_[0].get(), q, saved.u_TR[0], x_TD);
  }
  adapted_forward(k_proj_, lora_[1].get(), k, saved.u_TR[1], x_TD);
  adapted_forward(v_proj_, lora_[2].get(), v, saved.u_TR[2], x_TD);
  part.emplace(times_, StepPart::norms);
  if (qk_norm_ != QkNorm::none) {
    saved.q_raw = q;
    saved.k_raw = k;
    Tensor qn = Tensor::empty(q.shape(), dt), kn = Tensor::empty(k.shape(), dt);
    Tensor qn_rows = norm_rows(qn, qk_norm_, P_), kn_rows = norm_rows(kn, qk_norm_, P_);
    saved.rstd_q = Tensor::empty({qn_rows.size(0)}, acc_dtype_for(dt));
    saved.rstd_k = Tensor::empty({kn_rows.size(0)}, acc_dtype_for(dt));
    cpu::rmsnorm_forward(qn_rows, saved.rstd_q, norm_rows(q, qk_norm_, P_), q_norm_.value, eps_,
                         norm_cast_);
    cpu::rmsnorm_forward(kn_rows, saved.rstd_k, norm_rows(k, qk_norm_, P_), k_norm_.value, eps_,
                         norm_cast_);
    q = qn;
    k = kn;
  }
  saved.q = q.view({B, T, H_, P_});
  saved.k = k.view({B, T, Hkv_, P_});
  saved.v = v.view({B, T, Hkv_, P_});
  cpu::rope_forward(saved.q, saved.q, rope.cos_RP, rope.sin_RP);
  cpu::rope_forward(saved.k, saved.k, rope.cos_RP, rope.sin_RP);

  Tensor o = Tensor::empty({B, T, H_, P_}, dt);
  saved.lse_BTH = Tensor::empty({B, T, H_}, acc_dtype_for(dt));
  part.emplace(times_, StepPart::attention);
  cpu::attention_forward(o, saved.lse_BTH, saved.q, saved.k, saved.v, attention_options(rope));
  saved.o_TX = o.view({N, H_ * P_});
  if (output_gate_) {
    saved.core = saved.o_TX;
    saved.o_TX = Tensor::empty({N, H_ * P_}, dt);
    cpu::sigmoid_gate_forward(saved.o_TX, saved.core, saved.z);
  }
  part.emplace(times_, StepPart::projections);
  adapted_forward(o_proj_, lora_[3].get(), y_TD, saved.u_TR[3], saved.o_TX);
}

void AttentionBlock::backward(Tensor& dx_TD, const Tensor& dy_TD, const RopeTables& rope,
                              const AttentionSaved& saved, bool accumulate) {
  const int64_t B = rope.B, T = rope.T, N = B * T;
  const DType dt = dy_TD.dtype();

  Tensor do_TX = Tensor::empty({N, H_ * P_}, dt);
  std::optional<TimedPart> part(std::in_place, times_, StepPart::projections);
  adapted_backward(o_proj_, lora_[3].get(), do_TX, dy_TD, saved.o_TX, saved.u_TR[3], false);
  Tensor dz_TX;
  if (output_gate_) {
    Tensor dcore_TX = Tensor::empty({N, H_ * P_}, dt);
    dz_TX = Tensor::empty({N, H_ * P_}, dt);
    cpu::sigmoid_gate_backward(dcore_TX, dz_TX, do_TX, saved.core, saved.z);
    do_TX = dcore_TX;
  }
  const Tensor& o_TX = output_gate_ ? saved.core : saved.o_TX;  // attention's own output

  Tensor dq = Tensor::empty({B, T, H_, P_}, dt), dk = Tensor::empty({B, T, Hkv_, P_}, dt);
  Tensor dv = Tensor::empty({B, T, Hkv_, P_}, dt);
  part.emplace(times_, StepPart::attention);
  Tensor dsinks = sinks_.value.defined() ? sinks_.grad_sink() : Tensor();
  cpu::attention_backward(dq, dk, dv, do_TX.view({B, T, H_, P_}), saved.q, saved.k, saved.v,
                          o_TX.view({B, T, H_, P_}), saved.lse_BTH, attention_options(rope), false,
                          dsinks.defined() ? &dsinks : nullptr);
  part.emplace(times_, StepPart::norms);
  cpu::rope_backward(dq, dq, rope.cos_RP, rope.sin_RP);
  cpu::rope_backward(dk, dk, rope.cos_RP, rope.sin_RP);
  Tensor dq_TX = dq.view({N, H_ * P_}), dk_TX = dk.view({N, Hkv_ * P_});
  if (qk_norm_ != QkNorm::none) {
    Tensor dq_raw = Tensor::empty(dq_TX.shape(), dt), dk_raw = Tensor::empty(dk_TX.shape(), dt);
    Tensor dq_rows = norm_rows(dq_raw, qk_norm_, P_), dk_rows = norm_rows(dk_raw, qk_norm_, P_);
    // rmsnorm_backward accumulates dx and dw together: the weight grads must
    // accumulate, so dx starts from zero.
    dq_raw.zero();
    dk_raw.zero();
    Tensor dwq = q_norm_.grad_sink(), dwk = k_norm_.grad_sink();
    cpu::rmsnorm_backward(dq_rows, dwq, norm_rows(dq_TX, qk_norm_, P_),
                          norm_rows(saved.q_raw, qk_norm_, P_), q_norm_.value, saved.rstd_q, true,
                          norm_cast_);
    cpu::rmsnorm_backward(dk_rows, dwk, norm_rows(dk_TX, qk_norm_, P_),
                          norm_rows(saved.k_raw, qk_norm_, P_), k_norm_.value, saved.rstd_k, true,
                          norm_cast_);
    dq_TX = dq_raw;
    dk_TX = dk_raw;
  }
  Tensor dv_TX = dv.view({N, Hkv_ * P_});
  part.emplace(times_, StepPart::projections);
  if (output_gate_) {
    Tensor dqg_TX = Tensor::empty({N, 2 * H_ * P_}, dt);
    join_query_gate(dqg_TX, dq_TX, dz_TX, P_);
    dq_TX = dqg_TX;
  }
  adapted_backward(q_proj_, lora_[0].get(), dx_TD, dq_TX, saved.x_TD, saved.u_TR[0], accumulate);
  adapted_backward(k_proj_, lora_[1].get(), dx_TD, dk_TX, saved.x_TD, saved.u_TR[1], true);
  adapted_backward(v_proj_, lora_[2].get(), dx_TD, dv_TX, saved.x_TD, saved.u_TR[2], true);
}

}  // namespace tiermoe
