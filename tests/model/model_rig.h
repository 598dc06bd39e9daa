#pragma once
// Shared pieces of the model tests: tiny configs of each family, random
// weights that make every parameter matter, and token batches.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/testing.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/model/causal_lm.h"

namespace tiermoe::testing {

// Runs a scope on one thread. Finite differences run hundreds of forwards of
// a tiny model, where OpenMP start-up and barriers cost ~50x the arithmetic
// (far more when the shared cores are oversubscribed); results do not depend
// on the thread count (the kernels' contract), so nothing is lost.
struct SingleThread {
  SingleThread() { set_num_threads(1); }
  ~SingleThread() { set_num_threads(0); }
};

enum class Family { qwen3, olmoe, mixtral, qwen2, glm4, gpt_oss, deepseek_v3 };

// 3 layers, layer 1 dense (mlp_only_layers; Qwen3 and Qwen2 only), q_proj
// width H*P = 32 != D = 16 (OLMoE requires H*P = D: P = 4 there). `bias`:
// attention_bias, or Qwen2-MoE's and GLM-4.5's q/k/v bias (Qwen2's shared
// expert is 10 wide; GLM's layer 0 is dense, its shared experts 24 wide, its
// router sigmoid over 2 groups of 2 with routed_scaling_factor 2.5, its RoPE
// half-rotary and its q/k norm on; gpt-oss's layers are all MoE, sliding,
// full, sliding with a window of 2, with sinks, q/k/v/o bias, a biased router,
// biased experts and swiglu_limit 1; DeepSeek-V3 has GLM's MoE under
// multi-head latent attention: a q latent of 6, a kv latent of 5, q/k heads
// of 4 + 4 (nope + rope), v heads of 3, interleaved rope dims, YaRN with
// mscale_all_dim, and with `bias` a bias on q_a, kv_a and o_proj).
inline ModelConfig tiny_model_config(Family f, bool tied, bool norm_topk, bool bias = false) {
  ModelConfig c = preset("tiny");
  if (f == Family::olmoe) c.family = ModelFamily::olmoe, c.model_type = "olmoe";
  if (f == Family::mixtral) c.family = ModelFamily::mixtral, c.model_type = "mixtral";
  if (f == Family::qwen2) c.family = ModelFamily::qwen2_moe, c.model_type = "qwen2_moe";
  if (f == Family::glm4) c.family = ModelFamily::glm4_moe, c.model_type = "glm4_moe";
  if (f == Family::gpt_oss) c.family = ModelFamily::gpt_oss, c.model_type = "gpt_oss";
  if (f == Family::deepseek_v3) c.family = ModelFamily::deepseek_v3, c.model_type = "deepseek_v3";
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.moe_intermediate_size = 12;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.mlp_only_layers = {1};
  c.norm_topk_prob = norm_topk;
  c.tie_word_embeddings = tied;
  const bool qkv_only = f == Family::qwen2 || f == Family::glm4;
  c.attention_bias = bias && !qkv_only;
  c.qkv_bias = bias && qkv_only;
  if (f == Family::qwen2) c.shared_expert_intermediate_size = 10;
  c.output_router_logits = true;
  c.router_aux_loss_coef = 0.05;
  c.max_position_embeddings = 64;
  c.pad_token_id.reset();
  if (f == Family::olmoe) c.head_dim = 4;
  if (f == Family::olmoe || f == Family::mixtral) c.mlp_only_layers.clear();  // no dense layers
  if (f == Family::glm4 || f == Family::deepseek_v3) {
    c.mlp_only_layers.clear();
    c.first_k_dense_replace = 1;
    c.shared_expert_intermediate_size = 2 * c.moe_intermediate_size;
    c.n_group = 2;
    c.topk_group = 1;
    c.routed_scaling_factor = 2.5;
    c.use_qk_norm = true;
    c.partial_rotary_factor = 0.5;
    c.output_router_logits = false;  // the DeepSeek-V3 family has no aux loss
  }
  if (f == Family::deepseek_v3) {
    c.use_qk_norm = false;
    c.partial_rotary_factor = 1.0;
    c.num_key_value_heads = c.num_attention_heads;
    c.q_lora_rank = 6;
    c.kv_lora_rank = 5;
    c.qk_nope_head_dim = 4;
    c.qk_rope_head_dim = 4;
    c.head_dim = 4;
    c.v_head_dim = 3;
    c.rope_interleave = true;
    c.rope_scaling = {.kind = RopeScaling::Kind::yarn,
                      .factor = 4.0,
                      .original_max_position_embeddings = 16,
                      .mscale = 1.0,
                      .mscale_all_dim = 0.8};
  }
  if (f == Family::gpt_oss) {
    c.mlp_only_layers.clear();
    c.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
    c.sliding_window = 2;
    c.attention_bias = true;
    c.norm_topk_prob = false;
    c.swiglu_limit = 1.0;
  }
  return c;
}

// Matrices ~ N(0, 0.3^2), norm weights ~ 1 + N(0, 0.2^2), biases ~ N(0, 0.1^2):
// large enough that every path carries gradient, small enough to stay tame.
inline void randomize(CausalLM& model, uint64_t seed) {
  Rng rng(seed);
  for (ModelParam& p : model.params()) {
    Tensor t = Tensor::empty(p.value.shape(), DType::f64);
    switch (p.role) {
      case HfRole::norm: fill_normal(t, rng, 1.0, 0.2); break;
      case HfRole::bias: fill_normal(t, rng, 0.0, 0.1); break;
      default: fill_normal(t, rng, 0.0, 0.3); break;
    }
    p.value.copy_from(t);
  }
}

struct Batch {
  int64_t B = 2, T = 5;
  std::vector<int32_t> ids, targets;
};

// Random ids; targets are the next id, with a few ignored (-100).
inline Batch make_batch(int64_t V, uint64_t seed, int64_t B = 2, int64_t T = 5) {
  Rng rng(seed);
  Batch b{B, T, {}, {}};
  for (int64_t i = 0; i < B * T; ++i) b.ids.push_back(int32_t(rng.below(uint64_t(V))));
  for (int64_t i = 0; i < B * T; ++i) {
    b.targets.push_back(i % 4 == 3 ? -100 : int32_t(rng.below(uint64_t(V))));
  }
  return b;
}

// Every gradient of `params` against a reference's, stored under the same
// names in `grads_path` (F64): the trainable parameter sets must be equal, and each
// element within rtol * |want| + rtol * max|want| of its tensor (the floor
// follows the tensor's scale: an element near zero is a difference of large
// terms). Prints the worst element as a fraction of its tolerance.
inline void expect_grads_match(const std::vector<ModelParam>& params, const std::string& grads_path,
                               double rtol, const std::string& label) {
  CheckpointTensors grads = CheckpointTensors::open(grads_path);
  std::vector<std::string> names;  // what trains (not a selection-only buffer)
  for (const ModelParam& p : params) {
    if (p.requires_grad) names.push_back(p.name);
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, grads.names()) << label << ": the parameter sets differ";
  double worst = 0;
  std::string worst_at;
  for (const ModelParam& p : params) {
    if (!p.requires_grad || !grads.contains(p.name)) continue;
    Tensor want = grads.load(p.name, DType::f64);
    if (p.hf_transposed) {  // the file's [E, A, B] is the parameter's [E, B, A]
      const int64_t E = want.size(0), A = want.size(1), Bn = want.size(2);
      Tensor t = Tensor::empty({E, Bn, A}, DType::f64);
      for (int64_t e = 0; e < E; ++e)
        for (int64_t a = 0; a < A; ++a)
          for (int64_t b = 0; b < Bn; ++b)
            t.set((e * Bn + b) * A + a, want.get((e * A + a) * Bn + b));
      want = t;
    }
    ASSERT_EQ(want.shape(), p.grad.shape()) << p.name;
    double max_abs = 0;
    for (int64_t i = 0; i < want.numel(); ++i) max_abs = std::max(max_abs, std::abs(want.get(i)));
    EXPECT_TRUE(all_close(p.grad, want, rtol, rtol * max_abs, p.name)) << label;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double tol = rtol * std::abs(want.get(i)) + rtol * max_abs;
      const double frac = std::abs(p.grad.get(i) - want.get(i)) / tol;
      if (frac > worst) {
        worst = frac;
        worst_at = p.name + "[" + std::to_string(i) + "]: got " + std::to_string(p.grad.get(i)) +
                   ", want " + std::to_string(want.get(i));
      }
    }
  }
  std::printf("  %s: worst gradient element at %.3g of its tolerance: %s\n", label.c_str(), worst,
              worst_at.c_str());
}

}  // namespace tiermoe::testing
