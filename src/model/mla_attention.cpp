#include "tiermoe/model/mla_attention.h"

#include <algorithm>
#include <optional>

#include "column_copy.h"
#include "tiermoe/kernels/attention.h"
#include "tiermoe/kernels/rmsnorm.h"
#include "tiermoe/kernels/rope.h"

namespace tiermoe {

namespace {

// transformers builds q_a_layernorm and kv_a_layernorm with RMSNorm's default
// eps, not the config's rms_norm_eps.
constexpr double kLatentNormEps = 1e-6;

// k_NHQ[n, h, at + j] = k_rope_NR[n, j]: the one rope key of a token in every head.
void broadcast_rope_key(Tensor& k_NHQ, int64_t H, int64_t at, const Tensor& k_rope_NR) {
  const int64_t R = k_rope_NR.size(-1), Q = k_NHQ.size(-1), N = k_rope_NR.numel() / R;
  visit_dtype(k_NHQ.dtype(), [&]<class T>() {
    T* k = k_NHQ.data<T>();
    const T* r = k_rope_NR.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t h = 0; h < H; ++h) {
        std::copy(r + n * R, r + (n + 1) * R, k + (n * H + h) * Q + at);
      }
    }
  });
}

// dk_rope_NR[n, j] = sum over h of dk_NHQ[n, h, at + j], summed in acc_t and
// rounded once: the shared rope key's gradient.
void sum_rope_key_grad(Tensor& dk_rope_NR, const Tensor& dk_NHQ, int64_t H, int64_t at) {
  const int64_t R = dk_rope_NR.size(-1), Q = dk_NHQ.size(-1), N = dk_rope_NR.numel() / R;
  visit_dtype(dk_NHQ.dtype(), [&]<class T>() {
    T* out = dk_rope_NR.data<T>();
    const T* dk = dk_NHQ.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < R; ++j) {
        acc_t<T> sum = 0;
        for (int64_t h = 0; h < H; ++h) sum += load<T>(dk[(n * H + h) * Q + at + j]);
        out[n * R + j] = store<T>(sum);
      }
    }
  });
}

}  // namespace

MlaAttention::MlaAttention(const ModelConfig& c, DType compute, MatrixAlloc alloc)
    : compute_(compute),
      H_(c.num_attention_heads),
      Qn_(c.qk_nope_head_dim),
      Qr_(c.qk_rope_head_dim),
      Pv_(c.v_head_dim),
      Rq_(c.q_lora_rank),
      Rkv_(c.kv_lora_rank),
      scale_(attention_softmax_scale(c)),
      interleave_(c.rope_interleave) {
  const int64_t D = c.hidden_size, Q = Qn_ + Qr_;
  const bool bias = c.attention_bias;
  if (has_q_latent()) {
    proj_[kQ] = Linear::zeros(Rq_, D, bias, compute, alloc);
    proj_[kQb] = Linear::zeros(H_ * Q, Rq_, false, compute, alloc);
    q_norm_ = Weight::zeros({Rq_}, compute);
  } else {
    proj_[kQ] = Linear::zeros(H_ * Q, D, false, compute, alloc);
  }
  proj_[kKvA] = Linear::zeros(Rkv_ + Qr_, D, bias, compute, alloc);
  kv_norm_ = Weight::zeros({Rkv_}, compute);
  proj_[kKvB] = Linear::zeros(H_ * (Qn_ + Pv_), Rkv_, false, compute, alloc);
  proj_[kO] = Linear::zeros(D, H_ * Pv_, bias, compute, alloc);
}

const char* MlaAttention::proj_name(Proj p, bool q_latent) {
  switch (p) {
    case kQ: return q_latent ? "q_a_proj" : "q_proj";
    case kQb: return "q_b_proj";
    case kKvA: return "kv_a_proj_with_mqa";
    case kKvB: return "kv_b_proj";
    case kO: return "o_proj";
    case kProjs: break;
  }
  __builtin_unreachable();
}

std::vector<std::pair<std::string, Weight*>> MlaAttention::weights() {
  std::vector<std::pair<std::string, Weight*>> out;
  auto add = [&](Proj p) {
    const std::string name = proj_name(p, has_q_latent());
    out.push_back({name + ".weight", &proj_[p].weight});
    if (proj_[p].bias.value.defined()) out.push_back({name + ".bias", &proj_[p].bias});
  };
  add(kQ);
  if (has_q_latent()) {
    out.push_back({"q_a_layernorm.weight", &q_norm_});
    add(kQb);
  }
  add(kKvA);
  out.push_back({"kv_a_layernorm.weight", &kv_norm_});
  add(kKvB);
  add(kO);
  return out;
}

void MlaAttention::enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) {
  for (int i = 0; i < kProjs; ++i) {
    const Proj p = Proj(i);
    lora_[p].reset();
    if (p == kQb && !has_q_latent()) continue;
    lora_[p] = adapter_for(proj_[p], config, prefix + proj_name(p, has_q_latent()), compute_, rng);
  }
}

std::vector<LoraAdapter*> MlaAttention::lora_adapters() {
  std::vector<LoraAdapter*> out;
  for (auto& a : lora_) {
    if (a) out.push_back(a.get());
  }
  return out;
}

void MlaAttention::project(Proj p, Tensor& y_MO, const Tensor& x_MI, AttentionSaved& saved) const {
  adapted_forward(proj_[p], lora_[p].get(), y_MO, saved.u_TR[p], x_MI);
}

void MlaAttention::project_backward(Proj p, Tensor& dx_MI, const Tensor& dy_MO, const Tensor& x_MI,
                                    const AttentionSaved& saved, bool accumulate) {
  adapted_backward(proj_[p], lora_[p].get(), dx_MI, dy_MO, x_MI, saved.u_TR[p], accumulate);
}

void MlaAttention::forward(Tensor& y_TD, const Tensor& x_TD, const RopeTables& rope,
                           AttentionSaved& saved) const {
  const int64_t B = rope.B, T = rope.T, N = B * T, Q = Qn_ + Qr_, KV = Qn_ + Pv_;
  const DType dt = x_TD.dtype();
  const Pairs pairs = interleave_ ? Pairs::deinterleave : Pairs::kept;
  TIERMOE_ASSERT(x_TD.size(0) == N, x_TD.str(), " for B ", B, " T ", T);
  saved.clear();
  saved.x_TD = x_TD;

  // q, through its latent when there is one.
  Tensor q = Tensor::empty({B, T, H_, Q}, dt), q_TX = q.view({N, H_ * Q});
  std::optional<TimedPart> part(std::in_place, times_, StepPart::projections);
  if (has_q_latent()) {
    saved.q_raw = Tensor::empty({N, Rq_}, dt);
    project(kQ, saved.q_raw, x_TD, saved);
    part.emplace(times_, StepPart::norms);
    saved.q_latent = Tensor::empty({N, Rq_}, dt);
    saved.rstd_q = Tensor::empty({N}, acc_dtype_for(dt));
    cpu::rmsnorm_forward(saved.q_latent, saved.rstd_q, saved.q_raw, q_norm_.value, kLatentNormEps);
    part.emplace(times_, StepPart::projections);
    project(kQb, q_TX, saved.q_latent, saved);
  } else {
    project(kQ, q_TX, x_TD, saved);
  }
  // The kv latent and the rope key, then every head's k_nope and v.
  Tensor kv_a = Tensor::empty({N, Rkv_ + Qr_}, dt);
  project(kKvA, kv_a, x_TD, saved);
  part.emplace(times_, StepPart::norms);
  saved.k_raw = Tensor::empty({N, Rkv_}, dt);
  copy_block(saved.k_raw, Rkv_, 0, kv_a, Rkv_ + Qr_, 0, Rkv_);
  saved.kv_latent = Tensor::empty({N, Rkv_}, dt);
  saved.rstd_k = Tensor::empty({N}, acc_dtype_for(dt));
  cpu::rmsnorm_forward(saved.kv_latent, saved.rstd_k, saved.k_raw, kv_norm_.value, kLatentNormEps);
  part.emplace(times_, StepPart::projections);
  Tensor kv = Tensor::empty({N, H_ * KV}, dt);
  project(kKvB, kv, saved.kv_latent, saved);

  // RoPE on q's rope dims and on the shared key, in attention's order.
  part.emplace(times_, StepPart::norms);
  Tensor q_rope = Tensor::empty({B, T, H_, Qr_}, dt), k_rope = Tensor::empty({B, T, 1, Qr_}, dt);
  copy_block(q_rope, Qr_, 0, q, Q, Qn_, Qr_, pairs);
  copy_block(k_rope, Qr_, 0, kv_a, Rkv_ + Qr_, Rkv_, Qr_, pairs);
  cpu::rope_forward(q_rope, q_rope, rope.cos_RP, rope.sin_RP);
  cpu::rope_forward(k_rope, k_rope, rope.cos_RP, rope.sin_RP);
  copy_block(q, Q, Qn_, q_rope, Qr_, 0, Qr_);
  saved.q = q;
  saved.k = Tensor::empty({B, T, H_, Q}, dt);
  saved.v = Tensor::empty({B, T, H_, Pv_}, dt);
  copy_block(saved.k, Q, 0, kv, KV, 0, Qn_);
  broadcast_rope_key(saved.k, H_, Qn_, k_rope);
  copy_block(saved.v, Pv_, 0, kv, KV, Qn_, Pv_);

  Tensor o = Tensor::empty({B, T, H_, Pv_}, dt);
  saved.lse_BTH = Tensor::empty({B, T, H_}, acc_dtype_for(dt));
  part.emplace(times_, StepPart::attention);
  cpu::attention_forward(o, saved.lse_BTH, saved.q, saved.k, saved.v,
                         {.doc_start_BT = rope.doc_start_BT, .scale = scale_});
  saved.o_TX = o.view({N, H_ * Pv_});
  part.emplace(times_, StepPart::projections);
  project(kO, y_TD, saved.o_TX, saved);
}

void MlaAttention::backward(Tensor& dx_TD, const Tensor& dy_TD, const RopeTables& rope,
                            const AttentionSaved& saved, bool accumulate) {
  const int64_t B = rope.B, T = rope.T, N = B * T, Q = Qn_ + Qr_, KV = Qn_ + Pv_;
  const DType dt = dy_TD.dtype();
  const Pairs pairs = interleave_ ? Pairs::interleave : Pairs::kept;

  Tensor do_TX = Tensor::empty({N, H_ * Pv_}, dt);
  std::optional<TimedPart> part(std::in_place, times_, StepPart::projections);
  project_backward(kO, do_TX, dy_TD, saved.o_TX, saved, false);

  Tensor dq = Tensor::empty({B, T, H_, Q}, dt), dk = Tensor::empty({B, T, H_, Q}, dt);
  Tensor dv = Tensor::empty({B, T, H_, Pv_}, dt);
  part.emplace(times_, StepPart::attention);
  cpu::attention_backward(dq, dk, dv, do_TX.view({B, T, H_, Pv_}), saved.q, saved.k, saved.v,
                          saved.o_TX.view({B, T, H_, Pv_}), saved.lse_BTH,
                          {.doc_start_BT = rope.doc_start_BT, .scale = scale_});

  // Back through RoPE, and from attention's order to the projections'.
  part.emplace(times_, StepPart::norms);
  Tensor dq_rope = Tensor::empty({B, T, H_, Qr_}, dt), dk_rope = Tensor::empty({B, T, 1, Qr_}, dt);
  copy_block(dq_rope, Qr_, 0, dq, Q, Qn_, Qr_);
  sum_rope_key_grad(dk_rope, dk, H_, Qn_);
  cpu::rope_backward(dq_rope, dq_rope, rope.cos_RP, rope.sin_RP);
  cpu::rope_backward(dk_rope, dk_rope, rope.cos_RP, rope.sin_RP);
  copy_block(dq, Q, Qn_, dq_rope, Qr_, 0, Qr_, pairs);
  Tensor dkv_a = Tensor::empty({N, Rkv_ + Qr_}, dt);
  copy_block(dkv_a, Rkv_ + Qr_, Rkv_, dk_rope, Qr_, 0, Qr_, pairs);
  Tensor dkv = Tensor::empty({N, H_ * KV}, dt);
  copy_block(dkv, KV, 0, dk, Q, 0, Qn_);
  copy_block(dkv, KV, Qn_, dv, Pv_, 0, Pv_);

  // The kv latent: kv_b_proj, then its norm (whose dx starts from zero: its
  // weight grad must accumulate, and rmsnorm_backward accumulates both).
  part.emplace(times_, StepPart::projections);
  Tensor dkv_latent = Tensor::empty({N, Rkv_}, dt);
  project_backward(kKvB, dkv_latent, dkv, saved.kv_latent, saved, false);
  part.emplace(times_, StepPart::norms);
  Tensor dc_kv = Tensor::zeros({N, Rkv_}, dt), dw_kv = kv_norm_.grad_sink();
  cpu::rmsnorm_backward(dc_kv, dw_kv, dkv_latent, saved.k_raw, kv_norm_.value, saved.rstd_k, true);
  copy_block(dkv_a, Rkv_ + Qr_, 0, dc_kv, Rkv_, 0, Rkv_);

  // q, through its latent when there is one; then kv_a_proj onto the same dx.
  part.emplace(times_, StepPart::projections);
  const Tensor dq_TX = dq.view({N, H_ * Q});
  if (has_q_latent()) {
    Tensor dq_latent = Tensor::empty({N, Rq_}, dt);
    project_backward(kQb, dq_latent, dq_TX, saved.q_latent, saved, false);
    part.emplace(times_, StepPart::norms);
    Tensor dq_a = Tensor::zeros({N, Rq_}, dt), dw_q = q_norm_.grad_sink();
    cpu::rmsnorm_backward(dq_a, dw_q, dq_latent, saved.q_raw, q_norm_.value, saved.rstd_q, true);
    part.emplace(times_, StepPart::projections);
    project_backward(kQ, dx_TD, dq_a, saved.x_TD, saved, accumulate);
  } else {
    project_backward(kQ, dx_TD, dq_TX, saved.x_TD, saved, accumulate);
  }
  project_backward(kKvA, dx_TD, dkv_a, saved.x_TD, saved, true);
}

}  // namespace tiermoe
