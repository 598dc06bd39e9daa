#include "tiermoe/model/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "param_slot.h"
#include "tiermoe/kernels/cross_entropy.h"
#include "tiermoe/kernels/embedding.h"
#include "tiermoe/kernels/matmul.h"
#include "tiermoe/kernels/matmul_mixed.h"
#include "tiermoe/kernels/rmsnorm.h"
#include "tiermoe/moe/alltoall.h"
#include "tiermoe/moe/expert_math.h"

namespace tiermoe {

using detail::str_of;

void check_model_supported(const ModelConfig& c, const std::string& where) {
  c.validate(where);
  TIERMOE_CHECK(c.hidden_act == "silu", "hidden_act '" + c.hidden_act + "' is not supported",
                where, "TierMoE implements SwiGLU experts and MLPs (hidden_act silu)");
  TIERMOE_CHECK(!c.use_sliding_window, "use_sliding_window = true is not supported", where,
                "TierMoE implements full causal attention only");
  TIERMOE_CHECK(!c.clip_qkv, "clip_qkv is not supported", where,
                "remove clip_qkv (OLMoE checkpoints with it cannot be reproduced exactly)");
  TIERMOE_CHECK(c.head_dim % 2 == 0, "head_dim must be even for RoPE", where,
                "check head_dim in config.json");
}

namespace {

// The role of an attention kind's weight, by its name under the module.
HfRole attention_role(const std::string& suffix) {
  if (suffix == "conv1d.weight") return HfRole::conv;  // Gated DeltaNet's
  if (suffix == "A_log" || suffix == "dt_bias") return HfRole::decay;
  if (suffix == "norm.weight") return HfRole::gated_norm;
  if (suffix.find("norm") != std::string::npos) return HfRole::norm;
  if (suffix.ends_with(".bias")) return HfRole::bias;
  return suffix == "sinks" ? HfRole::sink : HfRole::attention;
}

std::unique_ptr<Dispatcher> make_dispatcher(const ModelConfig& c, Comm* comm) {
  if (!comm || comm->size() == 1) return std::make_unique<LocalDispatcher>();
  TIERMOE_CHECK(c.spec().expert_layout != ExpertLayout::fused_x_major,
                str_of("expert parallelism for ", c.model_type, " is not implemented"), "--ep",
                "its experts are fused tensors that every rank would load whole; run it on one "
                "rank");
  TIERMOE_CHECK(c.num_experts > 0 && c.num_experts % comm->size() == 0,
                str_of("expert parallelism over ", comm->size(),
                       " ranks needs an expert count they divide; the model has ", c.num_experts),
                "--ep", "run a number of ranks that divides num_experts");
  return std::make_unique<AllToAllDispatcher>(*comm);
}

}  // namespace

CausalLM::CausalLM(ModelConfig config, DType compute, Comm* comm, MatrixAlloc alloc)
    : config_(std::move(config)), dtype_(compute), comm_(comm) {
  check_model_supported(config_, "model config");
  rope_freqs_ = rope_frequencies(config_);
  dispatcher_ = make_dispatcher(config_, comm_);
  const int64_t V = config_.vocab_size, D = config_.hidden_size;
  embed_ = Weight::matrix({V, D}, compute, alloc);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    layers_.push_back(std::make_unique<DecoderLayer>(config_, l, compute, *dispatcher_, alloc));
    layers_.back()->set_step_times(step_times_.get());
  }
  norm_ = Weight::zeros({D}, compute);
  if (!config_.tie_word_embeddings) lm_head_ = Weight::matrix({V, D}, compute, alloc);
}

CausalLM::~CausalLM() = default;
CausalLM::CausalLM(CausalLM&&) noexcept = default;
CausalLM& CausalLM::operator=(CausalLM&&) noexcept = default;

// ---------------------------------------------------------------- parameters

std::vector<CausalLM::Slot> CausalLM::slots(bool with_grads) {
  std::vector<Slot> out;
  auto weight = [&](std::string name, HfRole role, Weight& w) {
    Tensor g = with_grads ? w.grad_sink() : Tensor();
    out.push_back({{std::move(name), role, w.value, g, w.requires_grad},
                   [&w](bool on) { w.set_requires_grad(on); }});
  };
  // Row slices [r0, r1) of a stacked weight and its grad.
  auto slice = [](const Tensor& t, int64_t r0, int64_t r1) {
    return t.defined() ? t.rows(r0, r1) : Tensor();
  };

  // A dense SwiGLU MLP under `module` ("model.layers.0.mlp."): gate_proj and
  // up_proj are row slices of its stacked w13.
  auto dense = [&](const std::string& module, DenseMlp& mlp) {
    Weight& w13 = mlp.w13();
    const int64_t I = mlp.intermediate();
    Tensor g13 = with_grads ? w13.grad_sink() : Tensor();
    auto set13 = [&w13](bool on) { w13.set_requires_grad(on); };
    out.push_back({{module + "gate_proj.weight", HfRole::dense_mlp, slice(w13.value, 0, I),
                    slice(g13, 0, I), w13.requires_grad},
                   set13});
    out.push_back({{module + "up_proj.weight", HfRole::dense_mlp, slice(w13.value, I, 2 * I),
                    slice(g13, I, 2 * I), w13.requires_grad},
                   set13});
    weight(module + "down_proj.weight", HfRole::dense_mlp, mlp.down());
  };

  weight("model.embed_tokens.weight", HfRole::embedding, embed_);
  for (auto& layer : layers_) {
    const std::string& p = layer->prefix();
    weight(p + "input_layernorm.weight", HfRole::norm, layer->input_layernorm());
    for (auto& [suffix, w] : layer->attention().weights()) {
      weight(layer->attention_name() + "." + suffix, attention_role(suffix), *w);
    }
    weight(p + "post_attention_layernorm.weight", HfRole::norm, layer->post_attention_layernorm());
    if (DenseMlp* mlp = layer->dense_mlp()) {
      dense(p + "mlp.", *mlp);
      continue;
    }
    MoeBlock& moe = *layer->moe();
    const std::string block = moe_block_prefix(config_, layer->index());
    if (config_.spec().expert_layout == ExpertLayout::fused_x_major) {
      fused_moe_slots(out, block, moe, with_grads);
      continue;
    }
    const bool router_on = moe.router_requires_grad();
    const std::string router = block + std::string(config_.spec().router_name) + ".";
    out.push_back({{router + "weight", HfRole::router, moe.router().param("weight"),
                    with_grads && router_on ? moe.router().grad("weight") : Tensor(), router_on},
                   [&moe](bool on) { moe.set_router_requires_grad(on); }});
    if (config_.sigmoid_router()) {
      // Selection only, as in transformers (a buffer): never trained.
      const std::string owner = config_.spec().selection_bias_on_block ? block : router;
      out.push_back({{owner + "e_score_correction_bias", HfRole::bias,
                      moe.router().param("e_score_correction_bias"), Tensor(), false},
                     [](bool) {}});
    }
    GroupedExperts& ex = moe.experts();
    const bool experts_on = moe.experts_requires_grad();
    Tensor g13, g2;
    if (with_grads && experts_on) {
      g13 = ex.grad("w13");  // allocates on first use
      g2 = ex.grad("w2");
    }
    const int64_t F = config_.moe_intermediate_size;
    auto set_experts = [&moe](bool on) { moe.set_experts_requires_grad(on); };
    // This rank's experts (all of them without expert parallelism).
    for (int64_t e = 0; e < local_experts(); ++e) {
      const int64_t global = first_expert() + e;
      auto name = [&](int proj) {
        return expert_weight_name(config_, layer->index(), global, proj);
      };
      // Quantized experts list placeholders: they are frozen, and widening
      // every expert for a listing would cost what the codes save.
      Tensor w13_e, w2_e;
      if (ex.quantized()) {
        w13_e = ex.param_or_placeholder("w13").select(e);
        w2_e = ex.param_or_placeholder("w2").select(e);
      } else {
        const ExpertWeights w = ex.weights(e);
        w13_e = w.w13_FD, w2_e = w.w2_DF;
      }
      Tensor g13_e = g13.defined() ? g13.select(e) : Tensor();
      Tensor g2_e = g2.defined() ? g2.select(e) : Tensor();
      out.push_back(
          {{name(0), HfRole::expert, slice(w13_e, 0, F), slice(g13_e, 0, F), experts_on, global},
           set_experts});
      out.push_back({{name(1), HfRole::expert, slice(w13_e, F, 2 * F), slice(g13_e, F, 2 * F),
                      experts_on, global},
                     set_experts});
      out.push_back({{name(2), HfRole::expert, w2_e, g2_e, experts_on, global}, set_experts});
    }
    if (SharedExpert* shared = layer->shared_expert()) {
      dense(layer->shared_expert_name() + ".", shared->mlp());
      if (shared->gated()) {
        weight(block + "shared_expert_gate.weight", HfRole::router, shared->gate());
      }
    }
  }
  weight("model.norm.weight", HfRole::norm, norm_);
  if (lm_head_.value.defined()) weight("lm_head.weight", HfRole::lm_head, lm_head_);
  for (Slot& s : out) {
    if (!s.param.requires_grad) s.param.grad = Tensor();
  }
  return out;
}

// A fused x-major MoE block (gpt-oss's) under `block` ("model.layers.0.mlp."):
// the biased router, and the experts as their four fused tensors (no
// per-expert names exist; expert parallelism is refused for the layout, so
// all are local).
void CausalLM::fused_moe_slots(std::vector<Slot>& out, const std::string& block, MoeBlock& moe,
                               bool with_grads) {
  const bool router_on = moe.router_requires_grad();
  auto set_router = [&moe](bool on) { moe.set_router_requires_grad(on); };
  for (const char* name : {"weight", "bias"}) {
    out.push_back({{block + std::string(config_.spec().router_name) + "." + name, HfRole::router,
                    moe.router().param(name),
                    with_grads && router_on ? moe.router().grad(name) : Tensor(), router_on},
                   set_router});
  }
  GroupedExperts& ex = moe.experts();
  const bool on = moe.experts_requires_grad();
  auto set_experts = [&moe](bool v) { moe.set_experts_requires_grad(v); };
  const std::string ep = block + "experts.";
  const std::pair<const char*, const char*> parts[] = {{"gate_up_proj", "w13"},
                                                       {"gate_up_proj_bias", "b13"},
                                                       {"down_proj", "w2"},
                                                       {"down_proj_bias", "b2"}};
  for (auto [hf, ours] : parts) {
    const bool matrix = ours[0] == 'w';
    ModelParam param{ep + hf, matrix ? HfRole::expert : HfRole::bias,
                     std::as_const(ex).param_or_placeholder(ours),
                     with_grads && on ? ex.grad(ours) : Tensor(), on};
    param.hf_transposed = matrix;
    out.push_back({std::move(param), set_experts});
  }
}

std::vector<ModelParam> CausalLM::params() {
  std::vector<ModelParam> out;
  for (Slot& s : slots(/*with_grads=*/true)) out.push_back(std::move(s.param));
  return out;
}

// The same walk as params() and lora_params(), so every gradient they list
// is zeroed and nothing else is. A trainable weight's gradient is allocated
// here if no backward has yet (the next backward would).
void CausalLM::zero_grad() {
  for (ModelParam& p : params()) {
    if (p.grad.defined()) p.grad.zero();
  }
  for (ModelParam& p : lora_params()) p.grad.zero();
}

void CausalLM::check_trainable(std::string_view name) const {
  TIERMOE_CHECK(!bound_, "'" + std::string(name) + "' cannot be trained",
                "a model loaded with WeightBinding::mapped",
                "its weights are the checkpoint's bytes at their stored width (frozen, for "
                "LoRA); load with WeightBinding::copy to train base weights");
}

void CausalLM::set_requires_grad(std::string_view name, bool on) {
  if (on) check_trainable(name);
  for (Slot& s : slots(/*with_grads=*/false)) {
    if (s.param.name == name) {
      s.set_requires_grad(on);
      return;
    }
  }
  throw Error("no parameter named '" + std::string(name) + "'", "CausalLM::set_requires_grad",
              "use the Hugging Face tensor names params() lists");
}

void CausalLM::set_requires_grad_all(bool on) {
  if (on) check_trainable("every parameter");
  for (Slot& s : slots(/*with_grads=*/false)) s.set_requires_grad(on);
}

// ---------------------------------------------------------------- forward / backward

std::vector<const Routing*> CausalLM::routings() const {
  std::vector<const Routing*> out;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l]->is_moe()) out.push_back(&saved_[l].moe.routing);
  }
  return out;
}

double CausalLM::forward(std::span<const int32_t> ids_BT, std::span<const int32_t> targets_BT,
                         int64_t B, int64_t T, bool grad, const TokenLayout& layout) {
  const int64_t N = B * T, D = config_.hidden_size;
  TIERMOE_CHECK(B >= 1 && T >= 1, detail::str_of("batch ", B, " x ", T, " tokens"),
                "CausalLM::forward", "B and T must be positive");
  TIERMOE_CHECK(int64_t(ids_BT.size()) == N && int64_t(targets_BT.size()) == N,
                detail::str_of(ids_BT.size(), " ids and ", targets_BT.size(), " targets for B ",
                               B, " x T ", T),
                "CausalLM::forward", "pass B*T ids and B*T targets");
  has_grad_state_ = false;
  B_ = B;
  T_ = T;
  ids_.assign(ids_BT.begin(), ids_BT.end());
  TIERMOE_CHECK(layout.counted_BT.empty() || int64_t(layout.counted_BT.size()) == N,
                detail::str_of(layout.counted_BT.size(), " padding flags for ", N, " tokens"),
                "CausalLM::forward", "pass one flag per token, or none");
  if (!layout.empty()) {
    rope_ = RopeTables::make(B, T, rope_freqs_, dtype_, layout.positions_BT, layout.doc_start_BT);
  } else if (rope_.B != B || rope_.T != T || rope_.cos_RP.dtype() != dtype_ || rope_custom_) {
    rope_ = RopeTables::make(B, T, rope_freqs_, dtype_);
  }
  rope_custom_ = !layout.empty();
  saved_.clear();
  saved_.resize(layers_.size());

  Tensor x_TD = Tensor::empty({N, D}, dtype_);
  std::optional<TimedPart> part(std::in_place, step_times_.get(), StepPart::embedding);
  if (embed_.value.dtype() == dtype_) {
    cpu::embedding_forward(x_TD, embed_.value, ids_BT);
  } else {
    // A table stored narrower (frozen bf16 in an f32 run): gather at its
    // width, then widen the rows (exact), never the table.
    Tensor rows_TD = Tensor::empty({N, D}, embed_.value.dtype());
    cpu::embedding_forward(rows_TD, embed_.value, ids_BT);
    x_TD.copy_from(rows_TD);
  }
  check_finite_activation(x_TD, "model.embed_tokens output");
  part.reset();
  for (size_t l = 0; l < layers_.size(); ++l) {
    x_TD = layers_[l]->forward(x_TD, rope_, saved_[l], grad);
  }

  xf_TD_ = x_TD;
  rstd_f_T_ = Tensor::empty({N}, acc_dtype_for(dtype_));
  nf_TD_ = Tensor::empty({N, D}, dtype_);
  part.emplace(step_times_.get(), StepPart::norms);
  cpu::rmsnorm_forward(nf_TD_, rstd_f_T_, xf_TD_, norm_.value, config_.rms_norm_eps,
                       rmsnorm_cast(config_));
  part.emplace(step_times_.get(), StepPart::lm_head);
  Weight& head = lm_head_.value.defined() ? lm_head_ : embed_;
  Tensor dw_head = grad ? head.grad_sink() : Tensor();
  dn_TD_ = grad ? Tensor::empty({N, D}, dtype_) : Tensor();
  loss_ = LossParts();
  loss_.targets = count_targets(targets_BT);
  loss_.ce = lm_head_loss(dn_TD_, dw_head, nf_TD_, head.value, targets_BT, head_chunk_);
  std::vector<const Routing*> rs = routings();
  part.emplace(step_times_.get(), StepPart::router);
  if (!rs.empty()) {
    aux_ = aux_loss_forward(rs, layout.counted_BT);
    loss_.aux = aux_.value;
  }
  part.reset();
  loss_.aux_in_total = config_.output_router_logits && !rs.empty();
  loss_.total = loss_.ce + (loss_.aux_in_total ? config_.router_aux_loss_coef * loss_.aux : 0.0);
  if (!std::isfinite(loss_.total)) {
    const bool norm_bad = first_non_finite(nf_TD_) >= 0;
    throw Error(str_of("the loss is ", loss_.total, " (cross-entropy ", loss_.ce, ", aux ",
                       loss_.aux,
                       norm_bad ? "); the output of model.norm is non-finite"
                                : "); the logits (lm_head) or the loss overflowed"),
                "CausalLM::forward", kNonFiniteHint);
  }
  has_grad_state_ = grad;
  return loss_.total;
}

Tensor CausalLM::logits() const {
  TIERMOE_CHECK(nf_TD_.defined(), "no forward has run", "CausalLM::logits",
                "call forward first");
  const Weight& head = lm_head_.value.defined() ? lm_head_ : embed_;
  Tensor logits_NV = Tensor::empty({nf_TD_.size(0), config_.vocab_size}, dtype_);
  cpu::matmul_forward_mixed(logits_NV, nf_TD_, head.value);
  return logits_NV;
}

void CausalLM::set_lm_head_chunk(int64_t tokens) {
  TIERMOE_CHECK(tokens >= 0, str_of("LM head chunk ", tokens, " must be >= 0"), "--lm-head-chunk",
                "pass a number of tokens, or 0 for one chunk");
  head_chunk_ = tokens;
}

void CausalLM::backward() {
  TIERMOE_CHECK(has_grad_state_, "backward without a forward that kept its state",
                "CausalLM::backward", "call forward(ids, targets, B, T, /*grad=*/true) first");
  has_grad_state_ = false;  // MoE saved state is consumed once
  const int64_t N = B_ * T_, D = config_.hidden_size;

  // The head's part (dn_TD_, and the head's weight gradient) ran in forward.
  std::optional<TimedPart> part(std::in_place, step_times_.get(), StepPart::norms);
  Tensor dx_TD = Tensor::zeros({N, D}, dtype_);
  Tensor dw_norm = norm_.grad_sink();
  cpu::rmsnorm_backward(dx_TD, dw_norm, dn_TD_, xf_TD_, norm_.value, rstd_f_T_,
                        /*accumulate=*/true, rmsnorm_cast(config_));
  dn_TD_ = Tensor();

  // The aux loss reaches each MoE layer's router logits directly.
  std::vector<const Routing*> rs = routings();
  std::vector<Tensor> dlogits_TE(rs.size());
  part.emplace(step_times_.get(), StepPart::router);
  if (loss_.aux_in_total) {
    aux_loss_backward(dlogits_TE, config_.router_aux_loss_coef, aux_, rs);
  }
  part.reset();
  size_t moe_index = rs.size();
  for (size_t l = layers_.size(); l-- > 0;) {
    Tensor extra = layers_[l]->is_moe() ? dlogits_TE[--moe_index] : Tensor();
    Tensor dprev_TD = Tensor::empty({N, D}, dtype_);
    layers_[l]->backward(dprev_TD, dx_TD, rope_, saved_[l], extra);
    dx_TD = dprev_TD;
  }
  part.emplace(step_times_.get(), StepPart::embedding);
  if (Tensor dtable = embed_.grad_sink(); dtable.defined()) {
    // nn.Embedding(padding_idx = pad_token_id): the lookup adds nothing to
    // the pad row's gradient (a tied lm_head still does).
    if (config_.pad_token_id) {
      for (int64_t t = 0; t < N; ++t) {
        if (ids_[size_t(t)] == *config_.pad_token_id) dx_TD.rows(t, t + 1).zero();
      }
    }
    cpu::embedding_backward(dtable, dx_TD, ids_, /*accumulate=*/true);
  }
  saved_.clear();
}

}  // namespace tiermoe
