#pragma once
// The memory plan of a training run: the peak bytes each MemoryTracker tag
// will reach, predicted from the run's settings alone (the config, the
// fine-tuning mode, dtypes, batch and sequence length, the remat policy and
// score absorption, LoRA targets, the optimizer, the device budget), before
// anything is loaded. `tiermoe train` logs it before loading, refuses a run
// whose plan exceeds --max-memory (what the machine has, by default) with
// what would make it fit, and reports it beside the measured peaks in --json.
//
// What each tag holds, and how it is predicted (N = batch x seq_len tokens,
// s = the compute dtype's size, a = the accumulation dtype's, 4 or 8):
//   weights      every parameter in the compute dtype; a LoRA run from a
//                checkpoint keeps its matrices where they are stored (mapped
//                below) and holds only norms, biases and routers, plus the
//                adapters (fp32), and the W13 matrices whose gate and up
//                parts the checkpoint's shards do not hold back to back
//                (copied at the stored width); frozen experts on the grouped
//                kernels add their packed copies (moe/expert_kernels.h);
//   mapped       the checkpoint's matrices read in place (LoRA from a
//                checkpoint): their bytes at the stored width;
//   grads        one gradient per trainable parameter (a), plus a second copy
//                of the replicated ones when a rank folds several micro-batches;
//   optimizer    AdamW's two moments (SGD's momentum) per trainable parameter,
//                and the fp32 master of a bf16 parameter;
//   saved        what the MoE layers keep for backward, per the remat policy
//                (moe/regions.h): routing, then x/h/a rows of the kept
//                regions; in backward one layer's replayed rows on top;
//   activations  the rest of forward's state, every layer's (attention
//                projections, norms, residual stream, dense MLPs, LoRA
//                intermediates), alive until backward ends, plus the largest
//                transient on top of it: an LM head chunk (its logits and
//                their gradient), or one layer's backward buffers (an adapted
//                projection's LoRA backward among them);
//   device       the device tier's budget (an upper bound: it holds at most that).
// Peaks of different tags need not coincide, so total() (their sum) bounds
// the run's tracked peak from above. Not tracked, so not planned: the
// program, thread stacks, the allocator's cached free blocks, the data set.
#include <array>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tiermoe/core/memory.h"
#include "tiermoe/train/trainer_config.h"

namespace tiermoe {

struct MemoryPlan {
  std::array<size_t, kNumMemTags> peak{};  // predicted peak bytes per tag
  size_t total() const;

  // A table of the tags, with the measured peaks (and predicted / measured)
  // when given.
  std::string table(const std::array<size_t, kNumMemTags>* measured = nullptr) const;
  // {"total": ..., "<tag>": {"predicted": ..., "measured": ...}, ...}
  nlohmann::json to_json(const std::array<size_t, kNumMemTags>* measured = nullptr) const;
};

// What the plan knows of the checkpoint a run reads.
struct StoredMatrices {
  DType dtype = DType::bf16;  // the dtype its matrices are stored in
  // Elements of rank 0's W13 matrices a mapped bind copies
  // (model/checkpoint.h: copied_w13_elements).
  int64_t copied_w13 = 0;
  // Whether its experts are stored as fused stacks (experts.gate_up_proj),
  // which bind as [E, ...] stacks rather than one expert at a time.
  bool fused_experts = false;
  // Matrices it ships at low width (io/stored_quant.h): the routed experts'
  // format and group (kept at it in frozen f32/bf16 runs), and whether the
  // attention and the dense MLPs (shared experts) are too (dequantized).
  std::optional<QuantFormat> experts_format;
  int64_t experts_group = 0;
  bool attention_quantized = false, dense_quantized = false;
  StoredMatrices(DType d, int64_t copied = 0, bool fused = false)
      : dtype(d), copied_w13(copied), fused_experts(fused) {}
};

// The plan of `config` on `model`. `stored` describes the checkpoint the run
// reads (none: a preset at random init); `ranks` the expert parallel ranks
// (each rank's share is planned).
MemoryPlan plan_memory(const TrainConfig& config, const ModelConfig& model,
                       std::optional<StoredMatrices> stored = std::nullopt, int ranks = 1);

// What would bring the plan under `limit` bytes: each a change of one setting
// (remat policy, batch, LoRA instead of full, bf16), with its planned total,
// best first; empty when nothing tried fits.
std::vector<std::string> ways_to_fit(const TrainConfig& config, const ModelConfig& model,
                                     std::optional<StoredMatrices> stored, int ranks, size_t limit);

}  // namespace tiermoe
