#pragma once
// The elementwise steps of one expert besides SwiGLU (kernels/activation.h):
// the GPT-OSS gated activation, the absorbed router-score scaling and the
// post-expert RMSNorm. Forward and backward side by side; math in acc_t<T>
// (f32 for bf16/f32, f64 for f64), one rounding to T at each store. Shared by
// every tier that runs experts, so host and device rows round identically.
#include "tiermoe/core/tensor.h"

namespace tiermoe {

struct GptOssActivation {
  double alpha = 1.702;  // swiglu_alpha
  double limit = 7.0;    // swiglu_limit
  auto operator<=>(const GptOssActivation&) const = default;
};

// h_M2F columns interleaved: 2i is gate i, 2i+1 is up i (GPT-OSS's gu[..., 0::2]
// and gu[..., 1::2]). gate = min(gate, limit), up = clamp(up, -limit, limit),
// a_MF = (up + 1) * gate * sigmoid(alpha * gate). Clamped inputs get zero
// gradient, like torch.clamp (the bounds themselves pass the gradient).
void gpt_oss_glu_forward(Tensor& a_MF, const Tensor& h_M2F, const GptOssActivation& act);
void gpt_oss_glu_backward(Tensor& dh_M2F, const Tensor& da_MF, const Tensor& h_M2F,
                          const GptOssActivation& act);

// Absorbed router scores: out_MF[m] = T(acc(a_MF[m]) * score_M[m]) -- a row of
// the activation goes to fp32 (f64 in f64 runs), times its score, back to T.
// score_M is the score dtype. out may alias a.
void scale_rows_forward(Tensor& out_MF, const Tensor& a_MF, const Tensor& score_M);
// da_MF = T(acc(dout_MF) * score_M), and dscore_M[m] (+)= <dout_MF[m], a_MF[m]>
// (the unscaled activation), summed in acc_t. da may alias dout.
void scale_rows_backward(Tensor& da_MF, Tensor& dscore_M, const Tensor& dout_MF,
                         const Tensor& a_MF, const Tensor& score_M, bool accumulate_dscore);

// y_MD += bias_D (scale_M undefined) or y_MD[m] += score_M[m] * bias_D
// (absorbed: the bias row scaled like the activation, so y = s * (a W^T + b)).
void add_bias_forward(Tensor& y_MD, const Tensor& bias_D, const Tensor& score_M);
// dbias_D += sum_m dy_MD[m] (* score_M[m]); dscore_M[m] += <dy_MD[m], bias_D>
// when score_M is defined. dbias is acc dtype (f32 for bf16).
void add_bias_backward(Tensor& dbias_D, Tensor& dscore_M, const Tensor& dy_MD,
                       const Tensor& bias_D, const Tensor& score_M);

// Post-expert RMSNorm over D: rstd = 1/sqrt(mean(y^2) + eps) (acc dtype),
// out = T(w * y * rstd). Scale-invariant in y, so it would erase an absorbed
// score: MoE layers refuse to absorb with it.
void rmsnorm_rows_forward(Tensor& out_MD, Tensor& rstd_M, const Tensor& y_MD, const Tensor& w_D,
                          double eps);
// dy_MD = rstd * (g - xhat * mean(g * xhat)) with g = dout * w, xhat = y * rstd;
// dw_D += sum_m dout * xhat (acc dtype).
void rmsnorm_rows_backward(Tensor& dy_MD, Tensor& dw_D, const Tensor& dout_MD, const Tensor& y_MD,
                           const Tensor& w_D, const Tensor& rstd_M);

}  // namespace tiermoe
