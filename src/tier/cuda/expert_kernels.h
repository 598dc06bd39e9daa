#pragma once
// The CUDA device's own kernels: the elementwise steps of an ExpertPlan
// (src/tier/expert_plan.h), one launcher per step kind. Every pointer comes
// from the graph's argument block (`block`, device memory: per ref its
// address) by ref index, -1 for an absent operand, so a graph captured once
// serves every launch. Math in the acc dtype (f32 for bf16 and f32 graphs,
// f64 for f64), one rounding to the graph dtype at each store, with the host
// formulas (kernels/ref, moe/expert_ops.h) written the same way; built with
// -fmad=false, so no product is fused into an add the host rounds apart.
// Scores and gradient sums are the acc dtype. Kept free of TierMoE headers
// so that nvcc compiles only this.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tiermoe::cuda {

enum class ElemType : uint8_t { f64, f32, bf16 };

struct Activation {
  bool gpt_oss = false;
  double alpha = 0, limit = 0;  // gpt_oss only
};

// Each launcher enqueues on `stream` and returns cudaGetLastError().
cudaError_t act_forward(cudaStream_t stream, ElemType t, const void* block, int h, int a, int w2_in,
                        int b13, int score, int64_t G, int64_t F, Activation act);
cudaError_t bias_forward(cudaStream_t stream, ElemType t, const void* block, int y, int b2,
                         int score, int64_t G, int64_t D);
cudaError_t row_dot(cudaStream_t stream, ElemType t, const void* block, int out, int x, int v,
                    int64_t G, int64_t D);
// `started_offset`: the byte offset of sum_started (int32) in the block.
cudaError_t column_sum(cudaStream_t stream, ElemType t, const void* block, size_t started_offset,
                       int out, int in, int score, int64_t G, int64_t C);
cudaError_t scale_rows(cudaStream_t stream, ElemType t, const void* block, int out, int a,
                       int score, int64_t G, int64_t F);
cudaError_t act_backward(cudaStream_t stream, ElemType t, const void* block, int dh, int da, int h,
                         int a, int score, int dscore, bool dscore_started, int64_t G, int64_t F,
                         Activation act);

}  // namespace tiermoe::cuda
