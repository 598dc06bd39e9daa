#pragma once
// Causal grouped-query attention, the scaled dot-product part (Hugging Face
// eager_attention_forward semantics); ref:: and cpu:: twins.
//
//   q [B, T, Hq, P]   k [B, T, Hkv, P]   v [B, T, Hkv, Pv]   out [B, T, Hq, Pv]
//   (Pv = P except for MLA, below); Hq a multiple of Hkv
//   query head h reads kv head h / (Hq / Hkv)           (repeat_kv)
//   s_ij  = cast(cast(q_i . k_j) * P^-0.5)              j <= i (causal)
//   p_ij  = cast(softmax_j(s_ij))                       softmax in f32
//   out_i = cast(sum_j p_ij v_j)                        f32 accumulation
// "cast" rounds to the compute dtype where HF's bf16 tensors would; f32 runs
// round only in f32 and f64 runs are f64 throughout.
//
// lse_BTH [B, T, Hq] (f32; f64 for f64) is each score row's log-sum-exp. The
// forward saves only it: backward recomputes the probabilities from q, k and
// lse (flash-attention style), so no T x T matrix is kept. Backward treats the
// casts as identity and keeps f32 until it rounds the outputs:
//   dp_ij = dout_i . v_j,  ds_ij = p_ij (dp_ij - D_i) P^-0.5,  D_i = sum_j p_ij dp_ij
//   dq_i = sum_j ds_ij k_j,  dk_j = sum_i ds_ij q_i,  dv_j = sum_i p_ij dout_i
// with dk, dv summed over the query heads of each kv group. D_i equals
// dout_i . out_i; backward takes the forward's `out` so the cpu:: kernel can
// use that (FlashAttention-2's row term) instead of a second pass over the
// keys; ref:: sums p dp itself. Sums run in a fixed order, so results do not
// depend on the thread count.
//
// cpu:: runs f32 and bf16 as a flash attention on the GEMM microkernels
// (kernels/cpu/attention.cpp: online softmax in key blocks, its exp a
// polynomial good to ~2 f32 ulps, P and dS rounded to bf16 where the
// microkernel reads bf16 operands), and f64 one row at a time with the
// forward bitwise ref::'s. Tests hold it to ref:: within tolerances written
// next to them (tests/kernels/test_attention.cpp).
//
// Options (AttentionOptions, the entry points' last input) narrow what a
// query sees or add a column to its softmax; the defaults are plain causal
// attention over each row:
//
// doc_start_BT  packed documents: several share a row of T tokens and no
//   token attends across a document boundary, as transformers' varlen
//   (flash-attention) path does for a batch flattened by
//   DataCollatorWithFlattening. doc_start_BT[b*T + i] is the index within
//   row b of the first token of i's document, so query i sees keys j with
//   doc_start <= j <= i. Documents are contiguous: doc_start of token 0 is 0,
//   and each later token either continues its predecessor's document (same
//   start) or begins one (start = its own index); anything else is an Error.
//   Empty: one document per row.
// window  a sliding window (gpt-oss's sliding_attention layers): query i sees
//   keys j > i - window as well, transformers' sliding_window_overlay; 0: no
//   window.
// sinks_H  [Hq] a learned logit per query head (gpt-oss), in q's dtype: an
//   extra softmax column no value carries, so lse_i = log(sum_j exp(s_ij) +
//   exp(sink_h)) and the probabilities of the keys sum to less than one. Its
//   gradient, dsink_h = -sum_{b,i} exp(sink_h - lse_i) D_i, is added to
//   dsinks_H (grad dtype: f32, f64 in f64 runs) when backward is given one.
// scale  the factor on q . k in place of P^-0.5 (DeepSeek-V3's MLA: YaRN's
//   mscale^2 over the square root of its q.k head dim).
//
// v may be narrower or wider than q and k (MLA's split heads): v [B, T, Hkv,
// Pv] and out, dout [B, T, Hq, Pv] with Pv its own; q, k keep P.
#include <cstdint>
#include <span>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

struct AttentionOptions {
  std::span<const int32_t> doc_start_BT;
  int64_t window = 0;
  const Tensor* sinks_H = nullptr;
  double scale = 0;  // the scores' scale; 0: P^-0.5
};

#define TIERMOE_ATTENTION_DECLS                                                                    \
  void attention_forward(Tensor& out, Tensor& lse_BTH, const Tensor& q, const Tensor& k,           \
                         const Tensor& v, const AttentionOptions& opt = {});                       \
  /* dq, dk, dv (+)= with accumulate; out is the forward's; dsinks_H += (may be null) */           \
  void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, \
                          const Tensor& k, const Tensor& v, const Tensor& out,                     \
                          const Tensor& lse_BTH, const AttentionOptions& opt = {},                 \
                          bool accumulate = false, Tensor* dsinks_H = nullptr);

namespace ref {
TIERMOE_ATTENTION_DECLS
}
namespace cpu {
TIERMOE_ATTENTION_DECLS
}

#undef TIERMOE_ATTENTION_DECLS

namespace cpu {
// The scratch cpu::attention_backward allocates as activations (memory plans
// count it): in f32 and bf16 the keys and values packed for the
// microkernel, and every query head's f32 partial dk and dv; f64 none.
// P: the q/k head dim, Pv: the v head dim.
size_t attention_backward_scratch_bytes(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t P,
                                        int64_t Pv, DType dt);
}  // namespace cpu

}  // namespace tiermoe
