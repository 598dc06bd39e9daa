#pragma once
// What a run is certain to allocate on the host, from the config alone, so
// that a model or batch that cannot fit is refused before the first tensor
// (with the sizes) instead of ending in bad_alloc or the OOM killer.
//
// It is a lower bound: weights, gradients and optimizer state exactly as the
// model and optimizers hold them, and of the activations only the residual
// stream every layer keeps for backward and one LM-head chunk of logits.
// Only what exceeds available memory even so is refused.
#include <cstdint>
#include <string>

#include "tiermoe/core/dtype.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {

struct RunMemoryShape {
  DType dtype = DType::f32;   // compute dtype
  bool backward = false;      // gradients of the inputs (training, --save-grads)
  bool full_ft = false;       // every parameter holds a gradient (and optimizer state)
  int optimizer_states = 0;   // master-dtype tensors per trainable parameter (AdamW: 2)
  int64_t tokens = 0;         // per micro-batch (batch x seq_len)
  int64_t lm_head_chunk = 0;  // token rows per LM-head chunk (0: all)
  int ranks = 1;              // expert parallel: each rank holds E / ranks experts
  // LoRA from a checkpoint: the frozen weights are the shards' memory-mapped
  // pages (checkpoint.h, WeightBinding::mapped), which the kernel can evict
  // and read again, so none of their bytes is certain to be resident.
  bool weights_mapped = false;
};

// Bytes per routed-expert parameter a checkpoint ships them at
// (quantization_config), or 0 when they are not at low width.
double stored_expert_bytes_per_param(const ModelConfig& c);

struct HostMemoryEstimate {
  uint64_t weights = 0, grads = 0, optimizer = 0, activations = 0;
  uint64_t total() const;  // saturates at 2^64 - 1
  // "weights 24.00 GB + gradients 24.00 GB + optimizer state 48.00 GB + activations 0.10 GB"
  std::string breakdown() const;
};

// Overflow-checked (an Error at `where`); a validated config never overflows
// the counts, but a huge batch may.
HostMemoryEstimate estimate_host_memory(const ModelConfig& config, const RunMemoryShape& run,
                                        const std::string& where);

// Throws when the estimate exceeds the host's available memory, with the
// breakdown and `hint`, naming `batch` (the flags that set the tokens) when
// activations are most of it and `model` otherwise.
void check_host_memory_for(const ModelConfig& config, const RunMemoryShape& run,
                           const std::string& model, const std::string& batch,
                           const std::string& hint);

}  // namespace tiermoe
