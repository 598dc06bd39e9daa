#pragma once
// Loading a Hugging Face checkpoint into a CausalLM and saving one back
// (CausalLM::from_checkpoint / save_checkpoint are the entry points; this
// header documents the rules they follow).
//
// Accepted layouts, per MoE layer:
//   per-expert  {block}.experts.{e}.gate_proj|up_proj|down_proj.weight   (Mixtral: w1|w3|w2)
//               with the router at {block}.gate.weight; block = mlp (Mixtral: block_sparse_moe)
//   fused       mlp.experts.gate_up_proj [E, 2F, D] (gate rows first) and
//               mlp.experts.down_proj [E, D, F] (transformers v5; Mixtral's router
//               then at mlp.gate.weight, its per-expert form's name also accepted)
// WeightBinding::copy: stored F64, F32 or BF16 tensors are converted to the
// compute dtype (as torch's .to() rounds).
// WeightBinding::mapped (frozen base weights, as LoRA runs have them): every
// weight matrix (embedding, lm_head, attention and dense-MLP projections,
// experts) stays at its stored width when that is no wider than the compute
// dtype (bf16 in an f32 run), and is a view of the memory-mapped shard, no
// copy: the mapping lives as long as a view of it, its bytes are counted
// under MemTag::mapped, and processes reading the same checkpoint share its
// page cache. Tensors the model stacks (gate_proj and up_proj as one [2F, D]
// matrix) are one view when they lie back to back in the shard (safetensors
// writers sort by name, so gate_proj precedes up_proj), else one copy at the
// stored width (MemTag::weights). A matrix stored wider than the compute
// dtype is converted (a copy), as are norms, biases and the router, which
// are small. The products read narrower weights through matmul_mixed.h.
// Such a model comes back frozen, and no base parameter can be unfrozen.
//
// Rejected before anything is loaded, each an Error naming the tensor:
//   - a tensor the config implies that the checkpoint lacks;
//   - a tensor whose shape disagrees with the config (both shapes given; the
//     embedding and lm_head name vocab_size / hidden_size in the hint);
//   - a tensor the config does not imply (e.g. a layer beyond
//     num_hidden_layers): an error, not a warning, since silently ignoring
//     weights would run a different model than the one on disk. The one
//     exception is rotary_emb.inv_freq, a buffer old transformers versions
//     saved, which is recomputed and skipped.
//
// A tied config (tie_word_embeddings true) whose checkpoint also stores
// lm_head.weight loads as transformers 5 loads it: values equal to the
// embedding's stay tied (one weight); other values untie the model (each
// weight its own; the model's config then says false, and so do the
// checkpoints it saves); lm_head.weight alone gives the tied embedding its
// values.
//
// With expert parallelism (a model built over a Comm of P ranks) a rank
// loads the tensors of its own experts and skips the others' (fused layouts:
// its rows of the stacked tensor); everything else is loaded on every rank.
#include <cstdint>
#include <string>
#include <string_view>

#include "tiermoe/model/causal_lm.h"

namespace tiermoe {

// Elements of the W13 matrices (gate and up stacked) that a mapped bind of
// `ck` in `compute` copies at their stored width instead of viewing in
// place, because their parts do not lie back to back in one shard
// (huggingface_hub's split can cut between an expert's gate_proj and
// up_proj): dense MLPs, and experts [first_expert, first_expert + experts)
// of each MoE layer; gpt-oss's x-major experts, both matrices, which bind as
// transposed copies. The memory plan counts them under weights, not mapped.
int64_t copied_w13_elements(const CheckpointTensors& ck, const ModelConfig& c, DType compute,
                            int64_t first_expert, int64_t experts);

// Whether `ck` stores the MoE layers' experts as fused stacks
// (mlp.experts.gate_up_proj), which bind as [E, ...] stacks rather than one
// expert at a time; read off the first MoE layer.
bool stores_fused_experts(const CheckpointTensors& ck, const ModelConfig& c);

// x [E, A, B] as a new [E, B, A] tensor in x's dtype: a ModelParam with
// hf_transposed (gpt-oss's x-major experts) to or from the checkpoint's layout.
Tensor swap_last_two_dims(const Tensor& x, MemTag tag = MemTag::activations);

// The routed expert an HF tensor or module name belongs to: e in
// "...experts.<e>.<proj>...", -1 for any other name (fused expert tensors
// included). With expert parallelism a rank loads only its experts' tensors
// and leaves the others' to their owners.
int64_t hf_expert_index(std::string_view name);

}  // namespace tiermoe
