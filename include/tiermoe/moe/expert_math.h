#pragma once
// The math of one expert over a block of its rows (GroupedExperts' formulas,
// experts.h), as free functions over an ExpertMath: the configuration and
// views of that one expert's weights. GroupedExperts runs them on the host
// over its stacked weights; the device tier runs the very same functions over
// its own copies of a resident expert, so a row computes the same bits
// wherever it runs (docs/architecture.md, parity rules).
//
// Weight gradients follow one summation rule on every tier. One backward call
// sums an expert's weight-gradient products over its rows in blocks of
// ExpertsConfig::dw_row_block rows, in row order: the first block's GEMM
// writes the sum, each later block's GEMM goes to scratch and is added to it.
// Bias and norm gradients run over the rows in order into the same sum. The
// caller then adds the sum to the accumulated gradient once. A device splits
// a large expert into bucket launches of dw_row_block rows and continues the
// sum launch by launch, so its sum is bitwise the host's (zero padded rows
// add nothing: kernels/matmul.h).
#include <cstdint>

#include "tiermoe/core/tensor.h"
#include "tiermoe/moe/experts.h"

namespace tiermoe {

// One expert's parameters: views of [E, ...] stacks, or a device's copies.
struct ExpertWeights {
  Tensor w13_FD;  // (2F, D) gate rows then up rows (gpt_oss: interleaved)
  Tensor w2_DF;   // (D, F)
  Tensor b13_F;   // (2F) bias only
  Tensor b2_D;    // (D) bias only
  Tensor norm_D;  // (D) post_norm only
};

// One backward call's parameter-gradient sums of one expert (grad dtype:
// f32 for bf16 runs), shaped like ExpertWeights.
struct ExpertGrads {
  Tensor dw13_FD, dw2_DF, db13_F, db2_D, dnorm_D;
  bool defined() const { return dw13_FD.defined(); }
  // Sums for an expert of `cfg` (bias and norm grads as it carries), not
  // initialised: expert_backward starts them (or a download fills them).
  static ExpertGrads empty(const ExpertsConfig& cfg, DType grad_dtype,
                           MemTag tag = MemTag::activations);
  // this += sum, elementwise in grad dtype (the one add of the rule above),
  // for each tensor both define (a caller may add dW2 and dW13 apart).
  void add(const ExpertGrads& sum);
};

struct ExpertMath {
  const ExpertsConfig* cfg = nullptr;
  DType dtype = DType::f32;          // weights and activations
  ExpertWeights w;
  ExpertAdapter* adapter = nullptr;  // LoRA on the host only; a device runs none
  int64_t expert = 0;                // the index the adapter is called with

  bool adapts(ExpertLinear p) const { return adapter && adapter->adapts(p); }
  DType grad_dtype() const { return dtype == DType::f64 ? DType::f64 : DType::f32; }
};

// forward = w13, act, w2 in this order (GroupedExperts::forward_rows).
void expert_forward(const ExpertMath& m, Tensor& y_MD, ExpertRowsActs& acts, const Tensor& x_MD,
                    const Tensor& score_M);
void expert_w13_forward(const ExpertMath& m, ExpertRowsActs& acts, const Tensor& x_MD);
void expert_act_forward(const ExpertMath& m, Tensor& a_MF, const Tensor& h_M2F);
void expert_w2_forward(const ExpertMath& m, Tensor& y_MD, ExpertRowsActs& acts,
                       const Tensor& score_M);

// dx_MD is written, dscore_M (absorbed) written. With `sum` defined the
// weight-gradient products go into it by the rule above: the sum is started
// here (overwritten) unless `sum_started`, when this call's rows continue it.
// Undefined `sum`: frozen experts, dx only.
void expert_backward(const ExpertMath& m, Tensor& dx_MD, Tensor& dscore_M, const Tensor& dy_MD,
                     const ExpertRowsActs& acts, const Tensor& score_M, ExpertGrads* sum,
                     bool sum_started);

// expert_backward's steps between its two dx products (da = dy . W2 and
// dx = dh . W13), for a caller that runs those products over all experts at
// once (moe/expert_kernels.h); expert_backward itself is the two sides with
// its products, adapters and postprocess in between. dy_MD is the W2
// output's gradient (after the postprocess's backward).
//   w2 side: dscore_M zeroed (absorbed), the b2 gradient, dW2 into `sum`;
//            returns W2's input (the scaled activation when absorbed and
//            wanted or summed, else acts.a_MF)
//   w13 side: da_MF (= dy . W2 plus any adapter's) through the score (in
//            place, dscore_M accumulated) and the activation into dh_M2F,
//            then the b13 gradient and dW13 into `sum`
Tensor expert_backward_w2_side(const ExpertMath& m, Tensor& dscore_M, const Tensor& dy_MD,
                               const ExpertRowsActs& acts, const Tensor& score_M, ExpertGrads* sum,
                               bool sum_started, bool want_w2_in);
void expert_backward_w13_side(const ExpertMath& m, Tensor& dh_M2F, Tensor& dscore_M, Tensor& da_MF,
                              const ExpertRowsActs& acts, const Tensor& score_M, ExpertGrads* sum,
                              bool sum_started);

}  // namespace tiermoe
