#pragma once
// The tensors a Hugging Face checkpoint of a ModelConfig holds, by their
// on-disk names and shapes, in the per-expert layout that save_pretrained
// writes. `tiermoe init` writes exactly this list and the loader checks a
// checkpoint against it. gpt-oss has no per-expert form: its experts are
// four fused tensors per layer as transformers names them (role expert or
// bias, expert -1), the matrices x-major: gate_up_proj [E, D, 2F] (gate and
// up interleaved), down_proj [E, F, D].
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tiermoe/core/random.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/io/model_config.h"

namespace tiermoe {

enum class HfRole : uint8_t {
  embedding,  // model.embed_tokens.weight
  lm_head,    // absent when tie_word_embeddings
  norm,       // every RMSNorm weight (layer norms, q/k norms, final norm)
  attention,  // q, k, v, o projections
  bias,       // attention biases (attention_bias, qkv_bias)
  router,     // the gate, [E, D]; Qwen2-MoE's shared_expert_gate, [1, D]
  expert,     // one expert's gate, up or down projection
  dense_mlp,  // the MLP of a non-MoE layer, and a MoE layer's shared expert
  sink,       // gpt-oss's attention sink logits, [H] per layer
  // Gated DeltaNet's (Qwen3.5's linear_attention layers):
  conv,        // the causal depthwise conv, conv1d.weight [C, 1, K]
  decay,       // A_log and dt_bias [Hv]: the state decay's (no weight decay, as Mamba's)
  gated_norm,  // the output's gated RMSNorm [Dv], by w even where the family's norms are 1 + w
};

struct HfTensor {
  std::string name;
  Shape shape;
  HfRole role;
  int64_t layer = -1;   // -1 outside the decoder layers
  int64_t expert = -1;  // for HfRole::expert
};

// Layer l's MoE block, "model.layers.{l}.mlp." (Mixtral: "...block_sparse_moe.").
std::string moe_block_prefix(const ModelConfig& config, int64_t layer);
// Where transformers 5 stores a router tensor of hf_tensors: under "mlp."
// when the family's block was renamed (Mixtral's block_sparse_moe.gate ->
// mlp.gate), else `name` itself.
std::string v5_router_name(const ModelConfig& config, const std::string& name);
// Expert e's projection in the per-expert layout: `proj` 0 gate, 1 up, 2 down
// ("model.layers.0.mlp.experts.3.up_proj.weight"; Mixtral's w1, w3, w2).
std::string expert_weight_name(const ModelConfig& config, int64_t layer, int64_t e, int proj);

// The module a weight belongs to: "model.layers.0.self_attn.q_proj" for
// "model.layers.0.self_attn.q_proj.weight"; other names as they are.
std::string hf_module_of(const std::string& weight);

// Whether the loader skips a stored tensor: recomputed buffers
// (rotary_emb.inv_freq) and the multi-token-prediction layers past the last
// decoder layer (num_nextn_predict_layers), a multimodal release's vision
// tower (model.visual.) and Qwen3.5's mtp. module, which transformers' text
// model skips too.
bool is_ignored_checkpoint_tensor(const ModelConfig& config, const std::string& name);

// Every tensor of the checkpoint, in module order (embedding, layer 0 ..
// layer L-1, final norm, lm_head).
std::vector<HfTensor> hf_tensors(const ModelConfig& config);

// The tensors a checkpoint of `config` may hold given the names it stores
// (`stored`), in module order: hf_tensors, except that per MoE layer the
// fused expert layout transformers 5 writes (save_original_format=False) is
// expected when either of its tensors is stored, mlp.experts.gate_up_proj
// [E, 2F, D] (gate rows first) and mlp.experts.down_proj [E, D, F] (role
// expert, expert -1); Mixtral's router under v5's name mlp.gate.weight when
// only that is stored; gpt-oss's expert matrices as MXFP4 _blocks and
// _scales when those are stored (io/mxfp4.h); and lm_head.weight in a tied model that stores one
// (transformers ties it when equal to the embedding, else unties the model).
// These are the rules CausalLM::from_checkpoint loads by.
std::vector<HfTensor> hf_checkpoint_tensors(const ModelConfig& config,
                                            const std::function<bool(const std::string&)>& stored);

// A freshly initialised tensor as transformers' _init_weights makes it:
// Linear weights and the embedding ~ normal(0, initializer_range), biases 0,
// RMSNorm weights 1, the pad_token_id row of the embedding 0.
//
// Random values come in blocks of kHfInitBlock elements (row-major order);
// block b of tensor `name` draws from its own stream
// Rng(hf_init_seed(seed, name, b)), by Box-Muller in pairs, in f64, rounded
// once to the dtype. So a tensor depends only on (seed, name, shape), and
// tensors and blocks can be generated in any order, in parallel.
inline constexpr int64_t kHfInitBlock = int64_t(1) << 16;

Tensor init_hf_tensor(const HfTensor& tensor, const ModelConfig& config, uint64_t seed,
                      DType dtype, MemTag tag = MemTag::weights);
// The same values written into `out` (shape tensor.shape, any dtype).
void fill_hf_tensor(Tensor& out, const HfTensor& tensor, const ModelConfig& config, uint64_t seed);
// Only blocks [block_begin, block_end) of it; does not allocate or throw, so
// it may run inside a parallel loop.
int64_t hf_init_blocks(const HfTensor& tensor);
void fill_hf_tensor_blocks(Tensor& out, const HfTensor& tensor, const ModelConfig& config,
                           uint64_t seed, int64_t block_begin, int64_t block_end);
uint64_t hf_init_seed(uint64_t seed, const std::string& name, int64_t block);

}  // namespace tiermoe
