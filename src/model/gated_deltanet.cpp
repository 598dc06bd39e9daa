#include "tiermoe/model/gated_deltanet.h"

#include <cmath>
#include <optional>

#include "column_copy.h"
#include "tiermoe/kernels/activation.h"
#include "tiermoe/kernels/causal_conv.h"
#include "tiermoe/kernels/gated_delta.h"
#include "tiermoe/kernels/rmsnorm.h"

namespace tiermoe {

namespace {

// z and h side by side, [R, 2 Dv] = [gate | up]: swiglu's layout, so the
// gated norm's silu(z) * h is kernels/activation.h's swiglu.
Tensor gate_and_up(const Tensor& z_RV, const Tensor& h_RV) {
  const int64_t V = z_RV.size(-1), R = z_RV.numel() / V;
  Tensor out = Tensor::empty({R, 2 * V}, z_RV.dtype());
  copy_block(out, 2 * V, 0, z_RV, V, 0, V);
  copy_block(out, 2 * V, V, h_RV, V, 0, V);
  return out;
}

}  // namespace

GatedDeltaNet::GatedDeltaNet(const GatedDeltaNetDims& dims, DType compute, MatrixAlloc alloc)
    : dims_(dims), compute_(compute) {
  const int64_t D = dims.hidden, Hv = dims.value_heads;
  TIERMOE_CHECK(
      dims.key_heads > 0 && Hv % dims.key_heads == 0 && dims.key_dim > 0 && dims.value_dim > 0 &&
          dims.conv_kernel > 0,
      detail::str_of("Gated DeltaNet with ", dims.key_heads, " key heads of ", dims.key_dim, ", ",
                     Hv, " value heads of ", dims.value_dim, ", a conv of ", dims.conv_kernel),
      "linear attention",
      "linear_num_value_heads must be a multiple of linear_num_key_heads, and every "
      "width positive");
  proj_[kQkv] = Linear::zeros(dims.conv_width(), D, false, compute, alloc);
  proj_[kZ] = Linear::zeros(dims.value_width(), D, false, compute, alloc);
  proj_[kB] = Linear::zeros(Hv, D, false, compute, alloc);
  proj_[kA] = Linear::zeros(Hv, D, false, compute, alloc);
  proj_[kOut] = Linear::zeros(D, dims.value_width(), false, compute, alloc);
  conv_ = Weight::zeros({dims.conv_width(), 1, dims.conv_kernel}, compute);
  dt_bias_ = Weight::zeros({Hv}, compute);
  A_log_ = Weight::zeros({Hv}, compute);
  norm_ = Weight::zeros({dims.value_dim}, compute);
}

const char* GatedDeltaNet::proj_name(Proj p) {
  switch (p) {
    case kQkv:
      return "in_proj_qkv";
    case kZ:
      return "in_proj_z";
    case kB:
      return "in_proj_b";
    case kA:
      return "in_proj_a";
    case kOut:
      return "out_proj";
    case kProjs:
      break;
  }
  return "?";
}

std::vector<std::pair<std::string, Weight*>> GatedDeltaNet::weights() {
  std::vector<std::pair<std::string, Weight*>> out = {{"dt_bias", &dt_bias_},
                                                      {"A_log", &A_log_},
                                                      {"conv1d.weight", &conv_},
                                                      {"norm.weight", &norm_}};
  for (Proj p : {kOut, kQkv, kZ, kB, kA})
    out.push_back({std::string(proj_name(p)) + ".weight", &proj_[p].weight});
  return out;
}

void GatedDeltaNet::enable_lora(const LoraConfig& config, const std::string& prefix, Rng& rng) {
  for (int i = 0; i < kProjs; ++i) {
    const Proj p = Proj(i);
    lora_[p] = adapter_for(proj_[p], config, prefix + proj_name(p), compute_, rng);
  }
}

std::vector<LoraAdapter*> GatedDeltaNet::lora_adapters() {
  std::vector<LoraAdapter*> out;
  for (auto& a : lora_) {
    if (a) out.push_back(a.get());
  }
  return out;
}

void GatedDeltaNet::project(Proj p, Tensor& y_MO, const Tensor& x_MI, AttentionSaved& saved) const {
  adapted_forward(proj_[p], lora_[p].get(), y_MO, saved.u_TR[p], x_MI);
}

void GatedDeltaNet::project_backward(Proj p, Tensor& dx_MI, const Tensor& dy_MO, const Tensor& x_MI,
                                     const AttentionSaved& saved, bool accumulate) {
  adapted_backward(proj_[p], lora_[p].get(), dx_MI, dy_MO, x_MI, saved.u_TR[p], accumulate);
}

Tensor GatedDeltaNet::normed_core(const Tensor& core, Tensor& rstd_R) const {
  const int64_t Dv = dims_.value_dim, R = core.numel() / Dv;
  Tensor h = Tensor::empty({R, Dv}, core.dtype());
  cpu::rmsnorm_forward(h, rstd_R, core.view({R, Dv}), norm_.value, dims_.norm_eps);
  return h;
}

void GatedDeltaNet::forward(Tensor& y_TD, const Tensor& x_TD, const RopeTables& rope,
                            AttentionSaved& saved) const {
  const int64_t B = rope.B, T = rope.T, N = B * T, C = dims_.conv_width();
  const int64_t Hk = dims_.key_heads, Dk = dims_.key_dim, Hv = dims_.value_heads;
  const int64_t Dv = dims_.value_dim, Kw = dims_.key_width(), Vw = dims_.value_width();
  const DType dt = x_TD.dtype(), sd = grad_dtype_for(dt);
  TIERMOE_ASSERT(x_TD.size(0) == N, x_TD.str(), " for B ", B, " T ", T);
  saved.clear();
  saved.x_TD = x_TD;
  const GatedDeltaOptions opt{rope.doc_start_BT};

  std::optional<TimedPart> part(std::in_place, times_, StepPart::projections);
  saved.conv_in = Tensor::empty({N, C}, dt);
  project(kQkv, saved.conv_in, x_TD, saved);
  saved.z = Tensor::empty({N, Vw}, dt);
  project(kZ, saved.z, x_TD, saved);
  saved.b_proj = Tensor::empty({B, T, Hv}, dt);
  Tensor b_TH = saved.b_proj.view({N, Hv});
  project(kB, b_TH, x_TD, saved);
  saved.a_proj = Tensor::empty({B, T, Hv}, dt);
  Tensor a_TH = saved.a_proj.view({N, Hv});
  project(kA, a_TH, x_TD, saved);

  part.emplace(times_, StepPart::norms);
  Tensor qkv = Tensor::empty({B, T, C}, dt);
  cpu::causal_conv_silu_forward(qkv, saved.conv_in.view({B, T, C}),
                                conv_.value.view({C, dims_.conv_kernel}), rope.doc_start_BT);
  // q and k before their l2 norms are kept for its backward.
  saved.q_raw = Tensor::empty({B, T, Hk, Dk}, dt);
  saved.k_raw = Tensor::empty({B, T, Hk, Dk}, dt);
  saved.v = Tensor::empty({B, T, Hv, Dv}, dt);
  copy_block(saved.q_raw, Kw, 0, qkv, C, 0, Kw);
  copy_block(saved.k_raw, Kw, 0, qkv, C, Kw, Kw);
  copy_block(saved.v, Vw, 0, qkv, C, 2 * Kw, Vw);
  saved.q = Tensor::empty(saved.q_raw.shape(), dt);
  saved.k = Tensor::empty(saved.k_raw.shape(), dt);
  ref::l2norm_forward(saved.q, saved.q_raw, 1.0 / std::sqrt(double(Dk)));
  ref::l2norm_forward(saved.k, saved.k_raw, 1.0);
  saved.g = Tensor::empty({B, T, Hv}, sd);
  saved.beta = Tensor::empty({B, T, Hv}, sd);
  ref::gated_delta_gates_forward(saved.g, saved.beta, saved.a_proj, saved.b_proj, A_log_.value,
                                 dt_bias_.value);

  part.emplace(times_, StepPart::attention);
  saved.core = Tensor::empty({B, T, Hv, Dv}, dt);
  cpu::gated_delta_forward(saved.core, saved.q, saved.k, saved.v, saved.g, saved.beta, opt);

  part.emplace(times_, StepPart::norms);
  saved.rstd_core = Tensor::empty({N * Hv}, sd);
  const Tensor h = normed_core(saved.core, saved.rstd_core);
  saved.o_TX = Tensor::empty({N, Vw}, dt);
  Tensor o_RV = saved.o_TX.view({N * Hv, Dv});
  cpu::swiglu_forward(o_RV, gate_and_up(saved.z.view({N * Hv, Dv}), h));

  part.emplace(times_, StepPart::projections);
  project(kOut, y_TD, saved.o_TX, saved);
}

void GatedDeltaNet::backward(Tensor& dx_TD, const Tensor& dy_TD, const RopeTables& rope,
                             const AttentionSaved& saved, bool accumulate) {
  const int64_t B = rope.B, T = rope.T, N = B * T, C = dims_.conv_width();
  const int64_t Hk = dims_.key_heads, Dk = dims_.key_dim, Hv = dims_.value_heads;
  const int64_t Dv = dims_.value_dim, Kw = dims_.key_width(), Vw = dims_.value_width();
  const DType dt = dy_TD.dtype(), sd = grad_dtype_for(dt);
  const GatedDeltaOptions opt{rope.doc_start_BT};

  std::optional<TimedPart> part(std::in_place, times_, StepPart::projections);
  Tensor do_TX = Tensor::empty({N, Vw}, dt);
  project_backward(kOut, do_TX, dy_TD, saved.o_TX, saved, false);

  // o = silu(z) * h, h = RMSNorm(core).
  part.emplace(times_, StepPart::norms);
  Tensor no_stats;
  const Tensor h = normed_core(saved.core, no_stats);
  Tensor dzh = Tensor::empty({N * Hv, 2 * Dv}, dt);
  cpu::swiglu_backward(dzh, do_TX.view({N * Hv, Dv}), gate_and_up(saved.z.view({N * Hv, Dv}), h));
  Tensor dz = Tensor::empty({N, Vw}, dt), dh = Tensor::empty({N * Hv, Dv}, dt);
  copy_block(dz, Dv, 0, dzh, 2 * Dv, 0, Dv);
  copy_block(dh, Dv, 0, dzh, 2 * Dv, Dv, Dv);
  Tensor dcore = Tensor::empty({B, T, Hv, Dv}, dt);
  Tensor dcore_RV = dcore.view({N * Hv, Dv});
  Tensor dnorm = norm_.grad_sink();
  cpu::rmsnorm_backward(dcore_RV, dnorm, dh, saved.core.view({N * Hv, Dv}), norm_.value,
                        saved.rstd_core);

  part.emplace(times_, StepPart::attention);
  Tensor dqn = Tensor::empty({B, T, Hk, Dk}, dt), dkn = Tensor::empty({B, T, Hk, Dk}, dt);
  Tensor dv = Tensor::empty({B, T, Hv, Dv}, dt);
  Tensor dg = Tensor::empty({B, T, Hv}, sd), dbeta = Tensor::empty({B, T, Hv}, sd);
  cpu::gated_delta_backward(dqn, dkn, dv, dg, dbeta, dcore, saved.q, saved.k, saved.v, saved.g,
                            saved.beta, opt);

  part.emplace(times_, StepPart::norms);
  Tensor da = Tensor::empty({B, T, Hv}, dt), db = Tensor::empty({B, T, Hv}, dt);
  Tensor dA_log = A_log_.grad_sink(), ddt_bias = dt_bias_.grad_sink();
  ref::gated_delta_gates_backward(da, db, dA_log, ddt_bias, dg, dbeta, saved.a_proj, saved.b_proj,
                                  A_log_.value, dt_bias_.value);
  // Back through the l2 norms, into the conv's output, then through the conv.
  Tensor dq = Tensor::empty(dqn.shape(), dt), dk = Tensor::empty(dkn.shape(), dt);
  ref::l2norm_backward(dq, dqn, saved.q_raw, 1.0 / std::sqrt(double(Dk)));
  ref::l2norm_backward(dk, dkn, saved.k_raw, 1.0);
  const Tensor w_CK = conv_.value.view({C, dims_.conv_kernel});
  Tensor dqkv = Tensor::empty({B, T, C}, dt);
  copy_block(dqkv, C, 0, dq, Kw, 0, Kw);
  copy_block(dqkv, C, Kw, dk, Kw, 0, Kw);
  copy_block(dqkv, C, 2 * Kw, dv, Vw, 0, Vw);
  Tensor dconv_in = Tensor::empty({N, C}, dt);
  Tensor dconv_in_BTC = dconv_in.view({B, T, C});
  Tensor dw = conv_.grad_sink();
  Tensor dw_CK = dw.defined() ? dw.view({C, dims_.conv_kernel}) : Tensor();
  cpu::causal_conv_silu_backward(dconv_in_BTC, dw_CK, dqkv, saved.conv_in.view({B, T, C}), w_CK,
                                 rope.doc_start_BT);

  part.emplace(times_, StepPart::projections);
  project_backward(kQkv, dx_TD, dconv_in, saved.x_TD, saved, accumulate);
  project_backward(kZ, dx_TD, dz, saved.x_TD, saved, true);
  project_backward(kB, dx_TD, db.view({N, Hv}), saved.x_TD, saved, true);
  project_backward(kA, dx_TD, da.view({N, Hv}), saved.x_TD, saved, true);
}

}  // namespace tiermoe
