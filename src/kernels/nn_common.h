#pragma once
// Internal to the non-GEMM kernels: input validation and the scalar formulas
// that the ref:: and cpu:: twins share, so both reject the same inputs with
// the same messages and elementwise ops round identically in both.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "tiermoe/core/dtype.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/kernels/rmsnorm.h"

namespace tiermoe::nn_detail {

inline std::string cat(std::string_view a, std::string_view b) {
  return std::string(a) + std::string(b);
}

inline void check_defined(const Tensor& t, std::string_view name, std::string_view op) {
  TIERMOE_CHECK(t.defined(), cat(name, " is an undefined tensor"), std::string(op),
                "allocate every output before calling the kernel");
}

inline void check_dtype_is(const Tensor& t, DType want, std::string_view name, std::string_view op,
                           std::string_view why) {
  check_defined(t, name, op);
  TIERMOE_CHECK(t.dtype() == want,
                cat(name, ": expected dtype ") + std::string(dtype_name(want)) + ", got " + t.str(),
                std::string(op), std::string(why));
}

inline void check_same_dtype_as(const Tensor& t, const Tensor& ref, std::string_view name,
                                std::string_view ref_name, std::string_view op) {
  check_defined(t, name, op);
  TIERMOE_CHECK(t.dtype() == ref.dtype(),
                cat(name, " is ") + t.str() + " but " + std::string(ref_name) + " is " + ref.str(),
                std::string(op), "these operands share one compute dtype");
}

inline void check_same_shape_as(const Tensor& t, const Tensor& ref, std::string_view name,
                                std::string_view ref_name, std::string_view op) {
  check_defined(t, name, op);
  TIERMOE_CHECK(t.shape() == ref.shape(),
                cat(name, " is ") + t.str() + " but " + std::string(ref_name) + " is " + ref.str(),
                std::string(op), "these operands must have the same shape");
}

inline void check_shape_is(const Tensor& t, const Shape& want, std::string_view name,
                           std::string_view op) {
  check_defined(t, name, op);
  TIERMOE_CHECK(t.shape() == want,
                cat(name, ": expected shape ") + shape_str(want) + ", got " + t.str(),
                std::string(op), "");
}

inline void check_rank(const Tensor& t, int64_t rank, std::string_view name, std::string_view op,
                       std::string_view layout) {
  check_defined(t, name, op);
  TIERMOE_CHECK(t.dim() == rank,
                cat(name, ": expected ") + std::string(layout) + ", got " + t.str(),
                std::string(op), "");
}

// A tensor of rank >= 1 seen as rows of its last dimension; returns the width.
inline int64_t check_rows(const Tensor& t, std::string_view name, std::string_view op) {
  check_defined(t, name, op);
  TIERMOE_CHECK(t.dim() >= 1, cat(name, ": expected at least one dimension, got ") + t.str(),
                std::string(op), "");
  return t.size(-1);
}
inline int64_t row_count(const Tensor& t) { return t.size(-1) == 0 ? 0 : t.numel() / t.size(-1); }

// The dtype weight gradients and saved statistics use: they sum over rows,
// so bf16 runs keep them in f32 (the fp32 master weights' dtype).
inline DType acc_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// Calls fn.template operator()<In, Out>() for the (input, output) storage
// pairs a kernel with an f32 output option accepts: equal dtypes, or bf16 in
// with f32 out (a bf16 run keeping an fp32 result unrounded).
template <class Fn>
void visit_in_out(DType in, DType out, std::string_view in_name, std::string_view out_name,
                  std::string_view op, Fn&& fn) {
  if (in == out) {
    visit_dtype(in, [&]<class T>() { fn.template operator()<T, T>(); });
    return;
  }
  TIERMOE_CHECK(in == DType::bf16 && out == DType::f32,
                std::string(in_name) + " is " + std::string(dtype_name(in)) + " but " +
                    std::string(out_name) + " is " + std::string(dtype_name(out)),
                std::string(op), "use one dtype for both, or f32 for a bf16 input");
  fn.template operator()<bf16, float>();
}

// Every id must lie in [0, limit); names the first offending position.
inline void check_ids(std::span<const int32_t> ids, int64_t limit, std::string_view name,
                      std::string_view op, std::string_view hint) {
  for (size_t i = 0; i < ids.size(); ++i) {
    TIERMOE_CHECK(ids[i] >= 0 && ids[i] < limit,
                  std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                      " is out of range [0, " + std::to_string(limit) + ")",
                  std::string(op), std::string(hint));
  }
}

// out = value, or out += value with accumulate (one rounding to T either way).
template <class T>
inline void put(T& out, acc_t<T> value, bool accumulate) {
  out = store<T>(accumulate ? load<T>(out) + value : value);
}

// ---- per op: shape checks and shared scalar formulas ----

inline void check_elementwise(const Tensor& out, std::string_view out_name, const Tensor& x,
                              std::string_view x_name, std::string_view op) {
  check_defined(x, x_name, op);
  check_same_shape_as(out, x, out_name, x_name, op);
  check_same_dtype_as(out, x, out_name, x_name, op);
}

// exp(x) in f32 without a libm call, so that the loops over an expert's
// activations vectorize (libm's expf, called per element, cost the grouped
// W13 + SwiGLU kernel half its time on AMX). Cephes' expf: x = n ln2 + r,
// |r| <= ln2 / 2, exp(r) by its degree-7 polynomial, times 2^n built in the
// exponent bits; within 2 ulp of expf. Every step is one IEEE operation
// (std::fma is one rounding, and the build does not contract), so a lane of
// a vectorized loop gives the bits of this scalar code. Inputs are clamped
// to [-87.33, 88] (results 2^-126 .. 1.65e38 instead of 0 and inf); NaN
// stays NaN.
inline float exp_f32(float x) {
  x = x > 88.0f ? 88.0f : x;  // comparisons are false for NaN: it passes
  x = x < -87.33654f ? -87.33654f : x;
  // t's low mantissa bits hold n = round(x / ln2): 1.5 * 2^23 leaves no fraction bits.
  const float t = std::fma(x, 1.44269504088896341f, 12582912.0f);
  const float n = t - 12582912.0f;
  float r = std::fma(n, -0.693359375f, x);  // ln2 in two parts: n * hi is exact
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r) + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(t) - 0x4B400000;  // n as an integer
  return p * std::bit_cast<float>((e + 127) << 23);
}

// exp in the accumulation type: exp_f32 for f32 (and bf16) runs, libm's
// exp in f64 (parity) runs.
template <class A>
inline A exp_acc(A x) {
  if constexpr (std::is_same_v<A, float>)
    return exp_f32(x);
  else
    return std::exp(x);
}

// SiLU as PyTorch's CPU kernel writes it: x / (1 + exp(-x)).
template <class A>
inline A silu(A x) {
  return x / (A(1) + exp_acc(-x));
}
// d silu / dx = s * (1 + x * (1 - s)) with s = sigmoid(x).
template <class A>
inline A silu_grad(A x) {
  A s = A(1) / (A(1) + exp_acc(-x));
  return s * (A(1) + x * (A(1) - s));
}

// sigmoid(x) on exp_acc.
template <class A>
inline A sigmoid(A x) {
  return A(1) / (A(1) + exp_acc(-x));
}

// GPT-OSS's clamped GLU of one (gate, up) pair, as GptOssExperts._apply_gate:
//   g = min(gate, limit), u = clamp(up, -limit, limit), a = (u + 1) g sigmoid(alpha g)
// with sigmoid on exp_acc (no libm call in f32 runs, so the loops vectorize).
template <class A>
inline A gpt_oss_glu(A gate, A up, A alpha, A limit) {
  const A g = std::min(gate, limit), u = std::clamp(up, -limit, limit);
  return (u + A(1)) * (g * (A(1) / (A(1) + exp_acc(-(alpha * g)))));
}
// Its gradients from da: the clamps pass none where they clipped.
template <class A>
inline void gpt_oss_glu_grad(A gate, A up, A alpha, A limit, A da, A& dgate, A& dup) {
  const A g = std::min(gate, limit), u = std::clamp(up, -limit, limit);
  const A sig = A(1) / (A(1) + exp_acc(-(alpha * g)));
  const A glu = g * sig;
  const A dglu = sig + g * alpha * sig * (A(1) - sig);
  dgate = gate <= limit ? da * (u + A(1)) * dglu : A(0);
  dup = up >= -limit && up <= limit ? da * glu : A(0);
}

// One row of SwiGLU, a[f] = silu(g[f]) * u[f] rounded once: the loop every
// SwiGLU forward runs (cpu twins, the grouped W13 epilogue), written so the
// compiler vectorizes it (no aliasing, no call).
template <class T>
inline void swiglu_row(T* __restrict a, const T* __restrict g, const T* __restrict u, int64_t n) {
  for (int64_t f = 0; f < n; ++f) a[f] = store<T>(silu(load(g[f])) * load(u[f]));
}

// Its backward over one row: dg (+)= da * u * silu'(g), du (+)= da * silu(g),
// each rounded once (put); the accumulate test outside the loop so that it
// vectorizes.
template <class T>
inline void swiglu_backward_row(T* __restrict dg, T* __restrict du, const T* __restrict g,
                                const T* __restrict u, const T* __restrict da, int64_t n,
                                bool accumulate) {
  auto row = [&]<bool kAcc>() {
    for (int64_t f = 0; f < n; ++f) {
      const acc_t<T> x = load(g[f]), d = load(da[f]);
      put(dg[f], d * load(u[f]) * silu_grad(x), kAcc);
      put(du[f], d * silu(x), kAcc);
    }
  };
  accumulate ? row.template operator()<true>() : row.template operator()<false>();
}

// h_N2F [N, 2F] (gate then up) against a_NF [N, F]; returns F.
// The output gate's operands (kernels/activation.h): each shaped and typed
// as x.
inline void check_sigmoid_gate(std::initializer_list<std::pair<const Tensor*, const char*>> outs,
                               const Tensor& x, const Tensor& g, std::string_view op) {
  check_elementwise(g, "g", x, "x", op);
  for (const auto& [t, name] : outs) check_elementwise(*t, name, x, "x", op);
}

inline int64_t check_swiglu(const Tensor& a_NF, std::string_view a_name, const Tensor& h_N2F,
                            std::string_view op) {
  check_rank(h_N2F, 2, "h_N2F", op, "[N, 2F]");
  TIERMOE_CHECK(h_N2F.size(1) % 2 == 0, "h_N2F: odd width in " + h_N2F.str(), std::string(op),
                "h_N2F holds gate columns [0, F) then up columns [F, 2F)");
  int64_t F = h_N2F.size(1) / 2;
  check_shape_is(a_NF, {h_N2F.size(0), F}, a_name, op);
  check_same_dtype_as(a_NF, h_N2F, a_name, "h_N2F", op);
  return F;
}

// rows_TD ([T, D], the forward output or the backward input) matches ids_T
// and the table's width D.
inline void check_embedding(const Tensor& rows_TD, std::string_view rows_name, int64_t D,
                            std::span<const int32_t> ids_T, std::string_view op) {
  check_rank(rows_TD, 2, rows_name, op, "[T, D]");
  check_shape_is(rows_TD, {int64_t(ids_T.size()), D}, rows_name, op);
}
inline constexpr const char* kIdHint =
    "token ids must lie in [0, vocab_size): check that the data was tokenized for this model";

// The normalised value x * rstd as RMSNorm multiplies it by w: rounded to
// T first (after_normalize), or kept for one rounding after w (after_weight).
template <class T, class A>
inline A normed(A n, RmsNormCast cast) {
  return cast == RmsNormCast::after_normalize ? A(round_to<T>(n)) : n;
}

// The factor a normalised value is multiplied by: w, or 1 + w (unit_offset).
template <class T>
inline acc_t<T> norm_weight(T w, RmsNormCast cast) {
  return cast == RmsNormCast::unit_offset ? acc_t<T>(1) + load(w) : load(w);
}

// Returns D; R = rows of x.
inline int64_t check_rmsnorm(const Tensor& x, const Tensor& w_D, std::string_view op) {
  int64_t D = check_rows(x, "x", op);
  TIERMOE_CHECK(D > 0, "x: RMSNorm over an empty last dimension: " + x.str(), std::string(op), "");
  check_shape_is(w_D, {D}, "w_D", op);
  check_same_dtype_as(w_D, x, "w_D", "x", op);
  return D;
}
inline void check_rstd(const Tensor& rstd_R, const Tensor& x, std::string_view op) {
  check_shape_is(rstd_R, {row_count(x)}, "rstd_R", op);
  check_dtype_is(rstd_R, acc_dtype(x.dtype()), "rstd_R", op,
                 "RMSNorm statistics are f32 (f64 in f64 runs)");
}

// Returns P; tables are [R, P] of one dtype.
inline int64_t check_rope_tables(const Tensor& cos_RP, const Tensor& sin_RP, std::string_view op) {
  check_rank(cos_RP, 2, "cos_RP", op, "[R, P]");
  check_same_shape_as(sin_RP, cos_RP, "sin_RP", "cos_RP", op);
  check_same_dtype_as(sin_RP, cos_RP, "sin_RP", "cos_RP", op);
  int64_t P = cos_RP.size(1);
  TIERMOE_CHECK(P % 2 == 0, "RoPE needs an even head dim, got " + cos_RP.str(), std::string(op),
                "rotate-half pairs element i with i + P/2");
  return P;
}
// One row of RoPE tables [P] at position pos: pair i's angle is
// inv_freq(i) * pos in A, its entries cos / sin of it times `scale` (1 for
// plain RoPE, where the product changes no bit).
template <class T, class InvFreq>
inline void rope_table_row(T* c, T* s, int32_t pos, int64_t P, InvFreq inv_freq, acc_t<T> scale) {
  using A = acc_t<T>;
  const int64_t half = P / 2;
  for (int64_t i = 0; i < half; ++i) {
    const A ang = A(inv_freq(i)) * A(pos);
    c[i] = c[i + half] = store<T>(std::cos(ang) * scale);
    s[i] = s[i + half] = store<T>(std::sin(ang) * scale);
  }
}

// Given RoPE frequencies: one per pair of the tables' width P, each finite and positive.
inline void check_rope_frequencies(std::span<const double> inv_freq, int64_t P,
                                   std::string_view op) {
  TIERMOE_CHECK(
      int64_t(inv_freq.size()) * 2 == P,
      std::to_string(inv_freq.size()) + " frequencies for tables of width " + std::to_string(P),
      std::string(op), "pass one frequency per rotated pair");
  for (double f : inv_freq) {
    TIERMOE_CHECK(std::isfinite(f) && f > 0, "RoPE frequency " + std::to_string(f), std::string(op),
                  "frequencies must be finite and positive");
  }
}
// x is [..., H, P] with leading dims flattening to the tables' R, and P at
// least the tables' width (partial rotary: the dims past it pass through);
// returns H.
inline int64_t check_rope_input(const Tensor& x, std::string_view x_name, const Tensor& cos_RP,
                                std::string_view op) {
  const int64_t rotary = check_rope_tables(cos_RP, cos_RP, op);
  check_defined(x, x_name, op);
  TIERMOE_CHECK(x.dim() >= 3 && x.size(-1) >= rotary,
                cat(x_name, ": expected [..., H, P] with P >= ") + std::to_string(rotary) +
                    ", got " + x.str(),
                std::string(op), "the tables' width is the rotated part of the head dim P");
  const int64_t P = x.size(-1);
  int64_t H = x.size(-2);
  TIERMOE_CHECK(x.numel() == cos_RP.size(0) * H * P,
                cat(x_name, " ") + x.str() + " has " +
                    std::to_string(H * P == 0 ? 0 : x.numel() / (H * P)) +
                    " rows but the RoPE tables have " + std::to_string(cos_RP.size(0)),
                std::string(op), "build the tables from one position per row of x");
  check_same_dtype_as(x, cos_RP, x_name, "cos_RP", op);
  return H;
}

// One rotated pair, rounded after each step as HF's eager code is:
// y1 = x1*c1 - x2*s1, y2 = x2*c2 + x1*s2 (c1 == c2 for HF tables).
template <class T>
inline void rope_pair(T& y1, T& y2, acc_t<T> x1, acc_t<T> x2, acc_t<T> c1, acc_t<T> s1, acc_t<T> c2,
                      acc_t<T> s2) {
  y1 = store<T>(round_to<T>(x1 * c1) + round_to<T>(-x2 * s1));
  y2 = store<T>(round_to<T>(x2 * c2) + round_to<T>(x1 * s2));
}
// Its transpose: dx1 = dy1*c1 + dy2*s2, dx2 = dy2*c2 - dy1*s1.
template <class T>
inline void rope_pair_backward(T& dx1, T& dx2, acc_t<T> dy1, acc_t<T> dy2, acc_t<T> c1, acc_t<T> s1,
                               acc_t<T> c2, acc_t<T> s2, bool accumulate) {
  acc_t<T> g1 = round_to<T>(round_to<T>(dy1 * c1) + round_to<T>(dy2 * s2));
  acc_t<T> g2 = round_to<T>(round_to<T>(dy2 * c2) + round_to<T>(-dy1 * s1));
  put(dx1, g1, accumulate);
  put(dx2, g2, accumulate);
}

// Pair i's frequency in A (f32, or f64 in f64 runs), the way HF builds it:
// 1 / theta^(float(2i) / P); its angle at pos is pos * inv_freq.
template <class A>
inline A rope_inv_freq(int64_t i, int64_t P, double theta) {
  return A(1) / std::pow(A(theta), A(2 * i) / A(P));
}

// logits_NV [N, V] against targets_N; returns the number of counted targets.
inline int64_t check_cross_entropy(const Tensor& logits_NV, std::span<const int32_t> targets_N,
                                   int32_t ignore_index, std::string_view op) {
  check_rank(logits_NV, 2, "logits_NV", op, "[N, V]");
  int64_t N = logits_NV.size(0), V = logits_NV.size(1);
  TIERMOE_CHECK(int64_t(targets_N.size()) == N,
                std::to_string(targets_N.size()) + " targets for logits " + logits_NV.str(),
                std::string(op), "one target per logits row");
  int64_t count = 0;
  for (size_t t = 0; t < targets_N.size(); ++t) {
    int32_t id = targets_N[t];
    if (id == ignore_index) continue;
    TIERMOE_CHECK(id >= 0 && id < V,
                  "targets_N[" + std::to_string(t) + "] = " + std::to_string(id) +
                      " is out of range [0, " + std::to_string(V) +
                      ") and is not the ignore index " + std::to_string(ignore_index),
                  std::string(op), "targets must be token ids of this vocabulary, or -100 to skip");
    ++count;
  }
  return count;
}

struct AttentionDims {
  int64_t B, T, Hq, Hkv, P;  // P: the q.k head dim
  int64_t Pv;                // the v (and output) head dim: P, or MLA's narrower one
  int64_t group() const { return Hq / Hkv; }
};
// q [B, T, Hq, P], k [B, T, Hkv, P], v [B, T, Hkv, Pv], lse_BTH [B, T, Hq] (acc dtype).
inline AttentionDims check_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& lse_BTH, std::string_view op) {
  check_rank(q, 4, "q", op, "[B, T, Hq, P]");
  check_rank(k, 4, "k", op, "[B, T, Hkv, P]");
  check_rank(v, 4, "v", op, "[B, T, Hkv, Pv]");
  AttentionDims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  TIERMOE_CHECK(k.size(0) == d.B && k.size(1) == d.T && k.size(3) == d.P,
                "k " + k.str() + " does not match q " + q.str(), std::string(op),
                "k is [B, T, Hkv, P] with q's B, T and P");
  TIERMOE_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0 && d.P > 0 && d.Pv > 0,
                "query heads " + std::to_string(d.Hq) + " are not a multiple of kv heads " +
                    std::to_string(d.Hkv) + " (or a head dim is 0)",
                std::string(op), "grouped-query attention needs Hq = g * Hkv");
  check_same_dtype_as(k, q, "k", "q", op);
  check_shape_is(v, {d.B, d.T, d.Hkv, d.Pv}, "v", op);
  check_same_dtype_as(v, q, "v", "q", op);
  check_shape_is(lse_BTH, {d.B, d.T, d.Hq}, "lse_BTH", op);
  check_dtype_is(lse_BTH, acc_dtype(q.dtype()), "lse_BTH", op,
                 "attention statistics are f32 (f64 in f64 runs)");
  return d;
}
// out, dout [B, T, Hq, Pv] in q's dtype.
inline void check_attention_out(const Tensor& t, const AttentionDims& d, const Tensor& q,
                                const char* name, std::string_view op) {
  check_shape_is(t, {d.B, d.T, d.Hq, d.Pv}, name, op);
  check_same_dtype_as(t, q, name, "q", op);
}

}  // namespace tiermoe::nn_detail
