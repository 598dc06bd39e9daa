#pragma once
// The gated delta rule: Gated DeltaNet's linear attention (Qwen3-Next,
// Qwen3.5-MoE's linear_attention layers), as transformers'
// torch_recurrent_gated_delta_rule computes it.
//
//   q, k [B, T, Hk, Dk]   v [B, T, Hv, Dv]   g, beta [B, T, Hv]   out [B, T, Hv, Dv]
//   Hv a multiple of Hk; value head h reads q/k head h / (Hv / Hk)
//   per (b, h), with a state S [Dk, Dv] starting at zero:
//     S   = exp(g_t) S                      the decay (g <= 0 in the model)
//     d_t = beta_t (v_t - S^T k_t)          the delta: what S mispredicts for k_t
//     S   = S + k_t d_t^T                   the rank-1 write
//     o_t = S^T q_t
// q and k are used as given: the layer l2-normalises them and scales q by
// Dk^-0.5 first (l2norm_forward below, transformers' use_qk_l2norm_in_kernel).
// The state, the products and out are f32 for f32 and bf16 inputs (out is
// rounded once to the compute dtype), f64 for f64, as transformers casts to
// float32 inside its kernel.
//
// doc_start_BT: packed documents, as kernels/attention.h defines it: the
// state is zero again at each document's first token, so no token reads an
// earlier document. Empty: one document per row.
//
// Backward runs the recurrence in reverse from a gradient dS on the state:
//   dS += q_t do_t^T;  dq_t = S_t do_t
//   dd = dS^T k_t;  dk_t = dS d_t;  dv_t = beta_t dd;  dbeta_t = (v_t - m_t) . dd
//   dm = -beta_t dd (m_t = S'^T k_t, S' the decayed state);  dS += k_t dm^T;  dk_t += S' dm
//   dg_t = <S', dS>;  dS = exp(g_t) dS, and zero at a document's first token
// dq and dk sum over the value heads of each q/k head. ref:: recomputes the
// states from the inputs one (b, h) at a time, keeping T + 1 of them: the
// oracle, exact but O(T Dk Dv) memory per head. cpu:: computes the same rule
// in chunks of kDeltaChunk tokens (FLA's chunked form: within a chunk the
// recurrence is small matrix products, src/kernels/cpu/gated_delta.cpp),
// never across a document, so it equals ref:: to rounding, and each
// document's result does not depend on where it sits in a row nor on the
// thread count; backward keeps each chunk's first state.
#include <cstdint>
#include <span>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

struct GatedDeltaOptions {
  std::span<const int32_t> doc_start_BT;
};

namespace cpu {
inline constexpr int64_t kDeltaChunk = 64;
void gated_delta_forward(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt = {});
void gated_delta_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                          const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt = {});
}  // namespace cpu

namespace ref {
void gated_delta_forward(Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt = {});
// Gradients in the inputs' dtypes (dg and dbeta in g's and beta's), written.
void gated_delta_backward(Tensor& dq, Tensor& dk, Tensor& dv, Tensor& dg, Tensor& dbeta,
                          const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& g, const Tensor& beta, const GatedDeltaOptions& opt = {});

// The rule's decay and write strength from the layer's projections a, b
// [B, T, Hv] (compute dtype) and its per-head A_log, dt_bias [Hv], as
// Qwen3_5MoeGatedDeltaNet makes them:
//   g    = -exp(A_log) softplus(a + dt_bias)    in f32 (f64 for f64)
//   beta = sigmoid(b)                           rounded to b's dtype, then widened
// g and beta are f32 (f64 for f64). Backward: da = dg (-exp(A_log))
// sigmoid(a + dt_bias), ddt_bias += sum of it, dA_log += sum dg g,
// db = dbeta beta (1 - beta); the parameter grads (f32, f64 for f64)
// accumulate and may be undefined (frozen).
void gated_delta_gates_forward(Tensor& g, Tensor& beta, const Tensor& a, const Tensor& b,
                               const Tensor& A_log, const Tensor& dt_bias);
void gated_delta_gates_backward(Tensor& da, Tensor& db, Tensor& dA_log, Tensor& ddt_bias,
                                const Tensor& dg, const Tensor& dbeta, const Tensor& a,
                                const Tensor& b, const Tensor& A_log, const Tensor& dt_bias);

// y = x / sqrt(sum(x^2) + eps) * scale over the last dim (FLA's l2norm, eps
// 1e-6, then transformers' Dk^-0.5 on q), in f32 (f64 for f64), rounded once.
void l2norm_forward(Tensor& y, const Tensor& x, double scale, double eps = 1e-6);
// dx = scale * (dy - x_hat (x_hat . dy)) / sqrt(sum(x^2) + eps), x_hat = x / sqrt(...).
void l2norm_backward(Tensor& dx, const Tensor& dy, const Tensor& x, double scale,
                     double eps = 1e-6);
}  // namespace ref

}  // namespace tiermoe
