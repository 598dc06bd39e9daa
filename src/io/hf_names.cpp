#include "tiermoe/io/hf_names.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <string_view>

namespace tiermoe {

namespace {

// Grouped-query attention's tensors (model/attention_block.h).
template <class Add>
void add_gqa_attention(const Add& add, const ModelConfig& c) {
  const int64_t D = c.hidden_size, P = c.head_dim, H = c.num_attention_heads;
  const int64_t Hkv = c.num_key_value_heads;
  // Qwen3.5's output gate: [q | gate] per head.
  const int64_t Q = c.spec().attention_output_gate ? 2 * H * P : H * P;
  add("self_attn.q_proj.weight", {Q, D}, HfRole::attention);
  add("self_attn.k_proj.weight", {Hkv * P, D}, HfRole::attention);
  add("self_attn.v_proj.weight", {Hkv * P, D}, HfRole::attention);
  add("self_attn.o_proj.weight", {D, H * P}, HfRole::attention);
  if (c.q_k_v_bias()) {
    add("self_attn.q_proj.bias", {Q}, HfRole::bias);
    add("self_attn.k_proj.bias", {Hkv * P}, HfRole::bias);
    add("self_attn.v_proj.bias", {Hkv * P}, HfRole::bias);
  }
  if (c.attention_bias) add("self_attn.o_proj.bias", {D}, HfRole::bias);
  if (c.spec().attention_sinks) add("self_attn.sinks", {H}, HfRole::sink);
  switch (c.qk_norm()) {
    case QkNorm::none: break;
    case QkNorm::per_head:  // one [P] weight shared by every head
      add("self_attn.q_norm.weight", {P}, HfRole::norm);
      add("self_attn.k_norm.weight", {P}, HfRole::norm);
      break;
    case QkNorm::whole:  // OLMoE normalises the whole projection
      add("self_attn.q_norm.weight", {H * P}, HfRole::norm);
      add("self_attn.k_norm.weight", {Hkv * P}, HfRole::norm);
      break;
  }
}

// Multi-head latent attention's (model/mla_attention.h), in DeepseekV3Attention's order.
template <class Add>
void add_mla_attention(const Add& add, const ModelConfig& c) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Q = c.qk_head_dim();
  const int64_t Rq = c.q_lora_rank, Rkv = c.kv_lora_rank, Qr = c.qk_rope_head_dim;
  if (Rq > 0) {
    add("self_attn.q_a_proj.weight", {Rq, D}, HfRole::attention);
    if (c.attention_bias) add("self_attn.q_a_proj.bias", {Rq}, HfRole::bias);
    add("self_attn.q_a_layernorm.weight", {Rq}, HfRole::norm);
    add("self_attn.q_b_proj.weight", {H * Q, Rq}, HfRole::attention);
  } else {
    add("self_attn.q_proj.weight", {H * Q, D}, HfRole::attention);
  }
  add("self_attn.kv_a_proj_with_mqa.weight", {Rkv + Qr, D}, HfRole::attention);
  if (c.attention_bias) add("self_attn.kv_a_proj_with_mqa.bias", {Rkv + Qr}, HfRole::bias);
  add("self_attn.kv_a_layernorm.weight", {Rkv}, HfRole::norm);
  add("self_attn.kv_b_proj.weight", {H * (c.qk_nope_head_dim + c.v_head_dim), Rkv},
      HfRole::attention);
  add("self_attn.o_proj.weight", {D, H * c.v_head_dim}, HfRole::attention);
  if (c.attention_bias) add("self_attn.o_proj.bias", {D}, HfRole::bias);
}

// Gated DeltaNet's (model/gated_deltanet.h), in Qwen3_5MoeGatedDeltaNet's order.
template <class Add>
void add_linear_attention(const Add& add, const ModelConfig& c) {
  const int64_t D = c.hidden_size, Hv = c.linear_num_value_heads;
  const int64_t value = c.linear_value_width(), C = c.linear_conv_width();
  add("linear_attn.dt_bias", {Hv}, HfRole::decay);
  add("linear_attn.A_log", {Hv}, HfRole::decay);
  add("linear_attn.conv1d.weight", {C, 1, c.linear_conv_kernel_dim}, HfRole::conv);
  add("linear_attn.norm.weight", {c.linear_value_head_dim}, HfRole::gated_norm);
  add("linear_attn.out_proj.weight", {D, value}, HfRole::attention);
  add("linear_attn.in_proj_qkv.weight", {C, D}, HfRole::attention);
  add("linear_attn.in_proj_z.weight", {value, D}, HfRole::attention);
  add("linear_attn.in_proj_b.weight", {Hv, D}, HfRole::attention);
  add("linear_attn.in_proj_a.weight", {Hv, D}, HfRole::attention);
}

void add_layer(std::vector<HfTensor>& out, const ModelConfig& c, int64_t l) {
  const int64_t D = c.hidden_size;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  auto add = [&](std::string name, Shape shape, HfRole role, int64_t expert = -1) {
    out.push_back({p + name, std::move(shape), role, l, expert});
  };

  add("input_layernorm.weight", {D}, HfRole::norm);
  if (c.mla()) {
    add_mla_attention(add, c);
  } else if (c.linear_attention(l)) {
    add_linear_attention(add, c);
  } else {
    add_gqa_attention(add, c);
  }
  add("post_attention_layernorm.weight", {D}, HfRole::norm);

  if (!c.is_moe_layer(l)) {
    const int64_t I = c.intermediate_size;
    add("mlp.gate_proj.weight", {I, D}, HfRole::dense_mlp);
    add("mlp.up_proj.weight", {I, D}, HfRole::dense_mlp);
    add("mlp.down_proj.weight", {D, I}, HfRole::dense_mlp);
    return;
  }
  const int64_t F = c.moe_intermediate_size;
  const FamilySpec& spec = c.spec();
  const std::string block = std::string(spec.moe_block) + ".";
  const std::string router = block + std::string(spec.router_name) + ".";
  add(router + "weight", {c.num_experts, D}, HfRole::router);
  if (spec.expert_layout == ExpertLayout::fused_x_major) {
    // The router's bias is drawn like its weight (GptOssPreTrainedModel).
    add(router + "bias", {c.num_experts}, HfRole::router);
    add(block + "experts.gate_up_proj", {c.num_experts, D, 2 * F}, HfRole::expert);
    add(block + "experts.gate_up_proj_bias", {c.num_experts, 2 * F}, HfRole::bias);
    add(block + "experts.down_proj", {c.num_experts, F, D}, HfRole::expert);
    add(block + "experts.down_proj_bias", {c.num_experts, D}, HfRole::bias);
    return;
  }
  // Selects experts only: never trained, initialised to zero like a bias.
  if (spec.sigmoid_router()) {
    const std::string& owner = spec.selection_bias_on_block ? block : router;
    add(owner + "e_score_correction_bias", {c.num_experts}, HfRole::bias);
  }
  for (int64_t e = 0; e < c.num_experts; ++e) {
    const std::string ep = block + "experts." + std::to_string(e) + ".";
    const auto& [gate, up, down] = spec.expert_projections;
    add(ep + std::string(gate) + ".weight", {F, D}, HfRole::expert, e);
    add(ep + std::string(up) + ".weight", {F, D}, HfRole::expert, e);
    add(ep + std::string(down) + ".weight", {D, F}, HfRole::expert, e);
  }
  if (c.has_shared_expert()) {  // Qwen2-MoE's with its sigmoid gate, GLM-4.5's without
    const int64_t S = c.shared_expert_intermediate_size;
    const std::string se = block + std::string(spec.shared_expert) + ".";
    add(se + "gate_proj.weight", {S, D}, HfRole::dense_mlp);
    add(se + "up_proj.weight", {S, D}, HfRole::dense_mlp);
    add(se + "down_proj.weight", {D, S}, HfRole::dense_mlp);
    if (spec.shared_expert_gated) add(block + "shared_expert_gate.weight", {1, D}, HfRole::router);
  }
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::string moe_block_prefix(const ModelConfig& c, int64_t layer) {
  return "model.layers." + std::to_string(layer) + "." + std::string(c.spec().moe_block) + ".";
}

std::string v5_router_name(const ModelConfig& c, const std::string& name) {
  if (!c.spec().router_renamed_in_v5) return name;
  const std::string block = "." + std::string(c.spec().moe_block) + ".";
  const size_t at = name.find(block);
  return at == std::string::npos ? name
                                 : name.substr(0, at) + ".mlp." + name.substr(at + block.size());
}

std::string expert_weight_name(const ModelConfig& c, int64_t layer, int64_t e, int proj) {
  return moe_block_prefix(c, layer) + "experts." + std::to_string(e) + "." +
         std::string(c.spec().expert_projections.at(size_t(proj))) + ".weight";
}

std::string hf_module_of(const std::string& weight) {
  static constexpr std::string_view kSuffix = ".weight";
  return weight.ends_with(kSuffix) ? weight.substr(0, weight.size() - kSuffix.size()) : weight;
}

bool is_ignored_checkpoint_tensor(const ModelConfig& c, const std::string& name) {
  if (name.ends_with("rotary_emb.inv_freq")) return true;
  // A multimodal release's vision tower, and Qwen3.5's multi-token-prediction
  // module (transformers' text model skips both).
  if (!c.spec().multimodal_model_type.empty() &&
      (name.starts_with("model.visual.") || name.starts_with("mtp."))) {
    return true;
  }
  if (c.num_nextn_predict_layers <= 0 || !name.starts_with("model.layers.")) return false;
  int64_t layer = 0;
  const char* first = name.data() + 13;
  const auto [end, ec] = std::from_chars(first, name.data() + name.size(), layer);
  return ec == std::errc() && end != first && *end == '.' && layer >= c.num_hidden_layers &&
         layer - c.num_hidden_layers < c.num_nextn_predict_layers;
}

std::vector<HfTensor> hf_tensors(const ModelConfig& c) {
  std::vector<HfTensor> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, HfRole::embedding});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) add_layer(out, c, l);
  out.push_back({"model.norm.weight", {c.hidden_size}, HfRole::norm});
  if (!c.tie_word_embeddings) {
    out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}, HfRole::lm_head});
  }
  return out;
}

std::vector<HfTensor> hf_checkpoint_tensors(
    const ModelConfig& c, const std::function<bool(const std::string&)>& stored) {
  const int64_t E = c.num_experts, F = c.moe_intermediate_size, D = c.hidden_size;
  std::vector<HfTensor> out;
  int64_t fused_layer = -1;  // the last layer whose fused pair is in `out`
  for (HfTensor& t : hf_tensors(c)) {
    const std::string p = "model.layers." + std::to_string(t.layer) + ".";
    const std::string fused = p + "mlp.experts.";
    const bool x_major = c.spec().expert_layout == ExpertLayout::fused_x_major;
    if (t.role == HfRole::expert && !x_major &&
        (stored(fused + "gate_up_proj") || stored(fused + "down_proj"))) {
      if (fused_layer != t.layer) {
        out.push_back({fused + "gate_up_proj", {E, 2 * F, D}, HfRole::expert, t.layer});
        out.push_back({fused + "down_proj", {E, D, F}, HfRole::expert, t.layer});
        fused_layer = t.layer;
      }
      continue;
    }
    if (t.role == HfRole::expert && x_major && stored(t.name + "_blocks")) {
      // MXFP4 (io/mxfp4.h): [E, out, in] in blocks of 32 along in; t.shape is x-major [E, in, out].
      const int64_t in = t.shape[1], out_dim = t.shape[2];
      out.push_back({t.name + "_blocks", {E, out_dim, in / 32, 16}, HfRole::expert, t.layer});
      out.push_back({t.name + "_scales", {E, out_dim, in / 32}, HfRole::expert, t.layer});
      continue;
    }
    if (t.role == HfRole::router && !stored(t.name) && stored(v5_router_name(c, t.name))) {
      t.name = v5_router_name(c, t.name);
    }
    out.push_back(std::move(t));
  }
  if (c.tie_word_embeddings && stored("lm_head.weight")) {
    out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}, HfRole::lm_head});
  }
  return out;
}

uint64_t hf_init_seed(uint64_t seed, const std::string& name, int64_t block) {
  // Rng seeds through splitmix64, so seeds that differ in any bit give
  // unrelated streams.
  return seed ^ fnv1a64(name) ^ (uint64_t(block) * 0x9e3779b97f4a7c15ull);
}

Tensor init_hf_tensor(const HfTensor& t, const ModelConfig& c, uint64_t seed, DType dtype,
                      MemTag tag) {
  Tensor out = Tensor::empty(t.shape, dtype, tag);
  fill_hf_tensor(out, t, c, seed);
  return out;
}

void fill_hf_tensor(Tensor& out, const HfTensor& t, const ModelConfig& c, uint64_t seed) {
  fill_hf_tensor_blocks(out, t, c, seed, 0, hf_init_blocks(t));
}

int64_t hf_init_blocks(const HfTensor& t) {
  return (shape_numel(t.shape) + kHfInitBlock - 1) / kHfInitBlock;
}

void fill_hf_tensor_blocks(Tensor& out, const HfTensor& t, const ModelConfig& c, uint64_t seed,
                           int64_t block_begin, int64_t block_end) {
  TIERMOE_ASSERT(out.shape() == t.shape, t.name);
  const int64_t lo = std::min(block_begin * kHfInitBlock, out.numel());
  const int64_t hi = std::min(block_end * kHfInitBlock, out.numel());
  const double std = c.initializer_range;
  visit_dtype(out.dtype(), [&]<class T>() {
    T* p = out.data<T>();
    // As the family's _init_weights: norms 1 (0 where they scale by 1 + w),
    // biases 0, dt_bias 1, A_log log U(0.01, 16) (below).
    const bool dt_bias = t.role == HfRole::decay && t.name.ends_with("dt_bias");
    if (t.role == HfRole::norm || t.role == HfRole::bias || t.role == HfRole::gated_norm ||
        dt_bias) {
      const bool zero =
          t.role == HfRole::bias || (t.role == HfRole::norm && c.spec().zero_centred_norms);
      std::fill(p + lo, p + hi, store<T>(acc_t<T>(zero ? 0.0 : 1.0)));
      return;
    }
    if (t.role == HfRole::decay) {  // A_log
      for (int64_t b = block_begin; b < block_end; ++b) {
        Rng rng(hf_init_seed(seed, t.name, b));
        const int64_t end = std::min((b + 1) * kHfInitBlock, out.numel());
        for (int64_t i = b * kHfInitBlock; i < end; ++i) {
          p[i] = store<T>(acc_t<T>(std::log(0.01 + (16.0 - 0.01) * rng.uniform())));
        }
      }
      return;
    }
    for (int64_t b = block_begin; b < block_end; ++b) {
      Rng rng(hf_init_seed(seed, t.name, b));
      const int64_t end = std::min((b + 1) * kHfInitBlock, out.numel());
      for (int64_t i = b * kHfInitBlock; i < end; i += 2) {
        const double r = std * std::sqrt(-2.0 * std::log(1.0 - rng.uniform()));  // 1-u in (0, 1]
        const double a = 2.0 * std::numbers::pi * rng.uniform();
        p[i] = store<T>(acc_t<T>(r * std::cos(a)));
        if (i + 1 < end) p[i + 1] = store<T>(acc_t<T>(r * std::sin(a)));
      }
    }
    if (t.role == HfRole::embedding && c.pad_token_id) {
      const int64_t row_lo = std::max(lo, *c.pad_token_id * t.shape[1]);
      const int64_t row_hi = std::min(hi, (*c.pad_token_id + 1) * t.shape[1]);
      if (row_lo < row_hi) std::fill(p + row_lo, p + row_hi, store<T>(acc_t<T>(0.0)));
    }
  });
}

}  // namespace tiermoe
