#pragma once
// A layer's experts on the grouped kernels (kernels/grouped_matmul.h): all
// of the layer's rows in one call per product instead of one GEMM per expert.
//
//   forward:  h, a, a*score = GLU(x . W13^T + b13)   one fused call, every expert
//             y = (a*score) . W2^T + score * b2       one call
//   backward: per expert, the W2 side of expert_math.h (b2 grad, dW2)
//             da = dy . W2                            one call
//             per expert, the W13 side (score, activation, b13 grad, dW13)
//             dx = dh . W13                           one call
//
// Every row is computed by the instructions of the per-expert path
// (expert_math.h) on the same ISA, and the weight gradients are summed by the
// same expert_math functions in the same row blocks, so the results are
// bitwise those of the per-expert path (tests/moe/test_expert_kernels.cpp), of
// the device tier's graphs (which run that path), and independent of which
// other experts share a call.
//
// The weights are packed into the kernels' layout once (ExpertPacks, owned
// by GroupedExperts) and re-packed when GroupedExperts::weights_version()
// moves: any mutable param() access, and weights_changed(), which the
// trainer calls after each optimizer step.
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "tiermoe/kernels/grouped_matmul.h"
#include "tiermoe/moe/experts.h"

namespace tiermoe {

// What packing has cost so far: calls that (re)packed a stack, their
// seconds, and the bytes the packed copies hold now.
struct ExpertPackStats {
  int64_t packs = 0;
  double seconds = 0;
  int64_t bytes = 0;
};

enum class ExpertPack : uint8_t { w13_glu, w2, w13_dx, w2_dx };

class ExpertPacks {
 public:
  // Whether the grouped kernels run these experts now: cpu kernels, an f32
  // or bf16 run whose expert weights are stored as it computes or narrower
  // (bf16 in an f32 run, widened while packing), stacked or bound one expert
  // at a time, no postprocess, a TierMoE ISA (not onednn), not
  // turned off here, and packed copies that fit (fits_host_memory).
  static bool applies(const GroupedExperts& experts);
  // The part of that rule a memory plan can check before any expert exists:
  // the grouped kernels compute in dt (f32 or bf16) on this process's ISA
  // (a TierMoE one, not onednn).
  static bool computes_in(DType dt);
  // Off: these experts keep one GEMM per expert (a benchmark's baseline, and
  // trainable experts: model/moe_block.h).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // The packed copies hold about twice the experts' weight bytes (a forward
  // and a dx layout of each stack) beside the weights. Before the first pack
  // they must fit in half the host memory available then, less the mapped
  // checkpoint bytes the run reads (MemTag::mapped); otherwise these
  // experts stay on one GEMM per expert for good (same bits, slower), rather
  // than a frozen model far larger than its grouped speed-up is worth running
  // the host out of memory. Decided once; `pack_refused()` says it was no.
  bool fits_host_memory(const GroupedExperts& experts);
  bool pack_refused() const { return refused_; }
  // The rule: packs of stacks of `stack_bytes` (W13 and W2 together, at the
  // run's width: a widened bf16 stack counts as f32) fit when about 2.25x
  // that is at most half of `available`.
  static bool packs_fit(uint64_t stack_bytes, uint64_t available);
  // The bytes the four packed stacks of `experts` experts of hidden D and
  // ffn F (gpt_oss: the clamped activation's layout) in dtype dt (f32 or
  // bf16) allocate on this process's ISA: what a memory plan counts.
  static int64_t packed_bytes(int64_t experts, int64_t D, int64_t F, bool gpt_oss, DType dt);
  // The stack packed for `which`, packed on first use and again when the
  // weights' version or the process's ISA changed. Thread-safe; the result
  // stays valid until the next weight change.
  const PackedWeights& get(const GroupedExperts& experts, ExpertPack which);
  ExpertPackStats stats() const;

 private:
  struct Slot {
    PackedWeights w;
    uint64_t version = 0;
    bool valid = false;
  };
  mutable std::mutex mutex_;
  Slot slots_[4];
  ExpertPackStats stats_;
  bool enabled_ = true;
  bool checked_ = false, refused_ = false;
};

// The rows of every expert not in skip_E (one flag per expert, or empty):
// y_ND and all.h_M2F, all.a_MF (N-row buffers) written, as forward_rows.
// An adapter's branches (all.lora_*_MR written) run per expert beside the
// grouped products, at forward_rows' points and with its bits; so do their
// backward, which reads all.lora_*_MR and all.x_MD where defined.
void grouped_experts_forward(const GroupedExperts& experts, Tensor& y_ND, ExpertRowsActs& all,
                             const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                             const Tensor& score_N, const std::vector<uint8_t>& skip_E);
// dx_ND (and dscore_N, absorbed) written and, with weight_grads, each
// expert's weight-gradient sum added to its grads, as backward_rows. `all`
// holds the N-row saves: h_M2F, a_MF when read, x_MD with weight_grads.
void grouped_experts_backward(GroupedExperts& experts, Tensor& dx_ND, Tensor& dscore_N,
                              const Tensor& dy_ND, const ExpertRowsActs& all,
                              const std::vector<int64_t>& offset_E, const Tensor& score_N,
                              bool weight_grads, const std::vector<uint8_t>& skip_E);

}  // namespace tiermoe
