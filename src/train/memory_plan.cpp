// The memory plan: each tag's peak from the run's settings (memory_plan.h says
// what each tag holds). The byte counts follow the tensors the model, the MoE
// layer and the trainer allocate (causal_lm.cpp, decoder_layer.cpp,
// attention_block.cpp, dense_mlp.cpp, moe_layer.cpp, expert_math.cpp,
// lora.cpp, parameter.cpp, expert_kernels.cpp); tests/train/test_memory_plan.cpp
// holds every tag within 10% of the measured peak.
#include "tiermoe/train/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/hf_names.h"
#include "tiermoe/kernels/attention.h"
#include "tiermoe/kernels/matmul_mixed.h"
#include "tiermoe/model/lora.h"
#include "tiermoe/moe/expert_kernels.h"
#include "tiermoe/moe/moe_layer.h"
#include "tiermoe/moe/regions.h"
#include "tiermoe/remat/policy.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/cuda_device.h"
#include "tiermoe/train/tier_session.h"

namespace tiermoe {

using detail::str_of;

namespace {

size_t& at(MemoryPlan& p, MemTag t) { return p.peak[size_t(t)]; }

// "1.23 GiB" from 1 GiB up, else "45.6 MiB".
std::string human(size_t b) {
  char buf[32];
  const double gib = double(b) / double(1ull << 30);
  if (gib >= 1)
    std::snprintf(buf, sizeof buf, "%.2f GiB", gib);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1ull << 20));
  return buf;
}

bool is_matrix(HfRole r) {
  return r == HfRole::embedding || r == HfRole::lm_head || r == HfRole::attention ||
         r == HfRole::dense_mlp || r == HfRole::expert;
}

struct Sizes {
  int64_t N, D, H, Hkv, P, E, K, F, I, V, R;
  size_t s, a;  // compute and accumulation dtype sizes
};

// Forward state of one decoder layer outside the MoE layer's record
// (activations), alive until backward ends.
size_t layer_kept(const Sizes& z, const ModelConfig& c, int64_t layer, bool moe, int64_t lora_attn,
                  int64_t lora_mlp, bool shared_kept) {
  // lora_mlp: the dense MLP's adapted projections, or in a MoE layer the
  // shared expert's (none kept when the region `shared` replays).
  const int64_t HP = z.H * z.P, KP = z.Hkv * z.P;
  const QkNorm qk = c.qk_norm();
  size_t b = size_t(z.N) * (3 * z.D) * z.s;  // input, normed input, h
  b += size_t(z.N) * 2 * z.a;                // the two rstd
  if (c.mla()) {
    // The latents before and after their norms and the norms' statistics,
    // q, k and v as attention read them, o and lse (model/mla_attention.cpp).
    const int64_t Q = c.qk_head_dim(), Pv = c.v_head_dim, Rq = c.q_lora_rank;
    b += size_t(z.N) * (2 * Rq + 2 * c.kv_lora_rank + 2 * z.H * (Q + Pv)) * z.s;
    b += size_t(z.N) * ((Rq > 0 ? 1 : 0) + 1 + z.H) * z.a;
  } else if (c.linear_attention(layer)) {
    // Gated DeltaNet (model/gated_deltanet.cpp): the conv's input [N, C], z,
    // in_proj_b's and _a's outputs, q and k before and after their l2 norms,
    // v, the rule's output and the gated output; g, beta and the norm's rstd.
    const int64_t Kw = c.linear_key_width(), Vw = c.linear_value_width();
    const int64_t Hv = c.linear_num_value_heads;
    b += size_t(z.N) * (c.linear_conv_width() + 4 * Kw + 4 * Vw + 2 * Hv) * z.s;
    b += size_t(z.N) * 3 * Hv * z.a;
  } else {
    b += size_t(z.N) * (qk == QkNorm::none ? HP + 2 * KP : 2 * (HP + KP) + KP) * z.s;
    if (qk == QkNorm::per_head) b += size_t(z.N) * (z.H + z.Hkv) * z.a;
    if (qk == QkNorm::whole) b += size_t(z.N) * 2 * z.a;
    b += size_t(z.N) * HP * z.s + size_t(z.N) * z.H * z.a;  // o, lse
    // The output gate's input and attention's output before it (Qwen3.5).
    if (c.spec().attention_output_gate) b += size_t(z.N) * 2 * HP * z.s;
  }
  b += size_t(z.N) * z.R * 4 * size_t(lora_attn + lora_mlp);  // LoRA u (fp32; f64 runs: below)
  if (!moe) b += size_t(z.N) * (z.D + 3 * z.I) * z.s;         // dense: m, h [N, 2I], a [N, I]
  if (moe && c.has_shared_expert() && shared_kept) {  // h [N, 2S], a [N, S], m [N, D], gate s [N]
    b += size_t(z.N) * (z.D + 3 * c.shared_expert_intermediate_size) * z.s + size_t(z.N) * z.a;
  }
  return b;
}

// One MoE layer's record at the end of forward (saved), and the rows a
// backward replay adds.
struct MoeSavedBytes {
  size_t kept = 0, replay = 0;
};

MoeSavedBytes moe_saved(const Sizes& z, const MoeRematPlan& rp, bool absorbed, bool lora_w13,
                        bool lora_w2) {
  const size_t NK = size_t(z.N * z.K);
  MoeSavedBytes m;
  m.kept = size_t(z.N) * z.D * z.s + 2 * size_t(z.N) * z.E * z.a + size_t(z.N) * z.K * z.a +
           NK * z.a;                        // x_TD, logits and probs, weights_TK, score_N
  if (!absorbed) m.kept += NK * z.D * z.s;  // y_ND
  const ExpertSaves& k = rp.routed_keep;
  const size_t x = NK * z.D * z.s, h = NK * 2 * z.F * z.s, a = NK * z.F * z.s;
  m.kept += (k.x ? x : 0) + (k.h ? h : 0) + (k.a ? a : 0);
  if (lora_w13 && k.lora_w13) m.kept += 2 * NK * z.R * 4;
  if (lora_w2 && k.lora_w2) m.kept += NK * z.R * 4;
  m.replay = (rp.replay_dispatch ? x : 0) + (rp.routed_replay.w13 ? h : 0) +
             (rp.routed_replay.act ? a : 0);
  if (lora_w13 && rp.routed_replay.w13) m.replay += 2 * NK * z.R * 4;
  if (lora_w2 && rp.routed_replay.w2) m.replay += NK * z.R * 4;
  return m;
}

// The device tier's memory: its workspace, then as many resident experts as
// the budget holds (each as the device keeps it: cost_model.h), at most every
// local one; the whole budget when even the workspace does not fit.
size_t planned_device_bytes(const ModelConfig& c, DType dt, int64_t El,
                            const std::optional<ExpertQuant>& quant, bool lora, size_t budget) {
  ExpertShape held = expert_shape(c, dt);
  held.quant = quant;
  const size_t workspace = bytes_workspace(held, ExpertsConfig{}.dw_row_block);
  if (El == 0 || workspace >= budget) return budget;
  const size_t per = bytes_resident(held, lora ? TrainMode::lora : TrainMode::full);
  const size_t experts = std::min(size_t(c.num_moe_layers() * El), (budget - workspace) / per);
  return workspace + experts * per;
}

}  // namespace

size_t MemoryPlan::total() const {
  size_t t = 0;
  for (size_t b : peak) t += b;
  return t;
}

MemoryPlan plan_memory(const TrainConfig& cfg, const ModelConfig& c,
                       std::optional<StoredMatrices> stored, int ranks) {
  const DType dt = cfg.dtype;
  const bool lora = cfg.lora.has_value();
  const int64_t R = lora ? cfg.lora->rank : 0;
  const int64_t B = cfg.trainer.batch, L = cfg.trainer.seq_len;
  Sizes z{B * L,
          c.hidden_size,
          c.num_attention_heads,
          c.num_key_value_heads,
          c.head_dim,
          c.num_experts,
          c.num_experts_per_tok,
          c.moe_intermediate_size,
          c.intermediate_size,
          c.vocab_size,
          R,
          dtype_size(dt),
          dt == DType::f64 ? size_t(8) : size_t(4)};
  const size_t master = z.a;  // masters, gradients, LoRA adapters: f32 (f64 in f64 runs)
  // Every rank holds as many experts: the plan is rank 0's, experts [0, El).
  const int64_t El = c.num_experts > 0 ? c.num_experts / std::max(ranks, 1) : 0;

  MemoryPlan p;
  // Parameters, adapters, gradients, optimizer state.
  const bool mapped = lora && stored.has_value();
  const bool quantized = cfg.experts.has_value();  // the routed experts at int4/int8
  // gpt-oss's MXFP4 experts stay as stored, mapped, in frozen f32/bf16 runs.
  const bool mxfp4_kept = mapped && c.quant_method == "mxfp4" && dt != DType::f64;
  // Experts a checkpoint ships at int4/int8/fp8 stay so in such runs; its
  // other low-width matrices are dequantized to the compute dtype.
  const bool stored_kept = mapped && stored->experts_format && dt != DType::f64;
  auto widened_at_load = [&](HfRole r) {
    return mapped && ((r == HfRole::attention && stored->attention_quantized) ||
                      (r == HfRole::dense_mlp && stored->dense_quantized));
  };
  // Such a run keeps the matrices at their stored width when it is no wider
  // than the run's; narrower ones are widened by the products (*_mixed).
  const bool keep_stored = mapped && is_narrower_or_same(stored->dtype, dt);
  const bool mixed = keep_stored && stored->dtype != dt;
  // Adapted attention projections per layer (hybrid models' layers differ).
  std::vector<int64_t> lora_attn_of(size_t(c.num_hidden_layers));
  int64_t trainable = 0, replicated_trainable = 0, lora_attn_modules = 0, lora_dense_modules = 0,
          lora_shared_modules = 0;
  bool lora_w13 = false, lora_w2 = false;
  // One adapted projection's backward (model/lora.cpp) holds, per row, the
  // branch gradient (out) and du (R) in the master dtype, and in a bf16 run
  // the input widened to it (in); the largest of an attention block's and of
  // a dense MLP's (or shared expert's) adapted projections.
  int64_t lora_attn_bwd = 0, lora_dense_bwd = 0;
  const bool widened = lora && lora_master_dtype(dt) != dt;
  for (const HfTensor& t : hf_tensors(c)) {
    if (t.role == HfRole::expert && t.expert >= El) continue;
    const size_t n = size_t(shape_numel(t.shape));
    if (quantized && t.role == HfRole::expert) {
      // Codes and f32 scales (rows padded to whole scale groups and words
      // ignored), held instead of the widened or mapped weights, which
      // quantizing released before the run's first step.
      at(p, MemTag::weights) += n * size_t(quant_code_bits(*cfg.experts)) / 8 +
                                (n + size_t(cfg.experts_group) - 1) / size_t(cfg.experts_group) * 4;
    } else if (mxfp4_kept && t.role == HfRole::expert) {
      at(p, MemTag::mapped) += n / 2 + n / 32;  // E2M1 codes and E8M0 scales
    } else if (stored_kept && t.role == HfRole::expert) {
      // Codes and f32 scales, read into memory of their own.
      const QuantFormat f = *stored->experts_format;
      const size_t per_scale = f == QuantFormat::fp8 ? 128 * 128 : size_t(stored->experts_group);
      at(p, MemTag::weights) +=
          n * size_t(quant_code_bits(f)) / 8 + (n + per_scale - 1) / per_scale * 4;
    } else if (widened_at_load(t.role)) {
      at(p, MemTag::weights) += n * dtype_size(dt);
    } else if (mapped && is_matrix(t.role)) {
      const DType kept_as = keep_stored ? stored->dtype : dt;
      at(p, keep_stored ? MemTag::mapped : MemTag::weights) += n * dtype_size(kept_as);
    } else {
      at(p, MemTag::weights) += n * z.s;
    }
    if (!lora) {
      trainable += int64_t(n);
      if (t.role != HfRole::expert) replicated_trainable += int64_t(n);
      continue;
    }
    const bool linear =
        t.role == HfRole::attention || t.role == HfRole::dense_mlp || t.role == HfRole::expert;
    if (!linear || !lora_targets_module(*cfg.lora, hf_module_of(t.name))) continue;
    const int64_t adapter = R * (t.shape[0] + t.shape[1]);
    trainable += adapter;
    if (t.role != HfRole::expert) replicated_trainable += adapter;
    at(p, MemTag::weights) += size_t(adapter) * master;
    const int64_t bwd = t.shape[0] + R + (widened ? t.shape[1] : 0);  // [out, in]
    if (t.role == HfRole::attention) {
      ++lora_attn_modules;
      ++lora_attn_of[size_t(t.layer)];
      lora_attn_bwd = std::max(lora_attn_bwd, bwd);
    }
    if (t.role == HfRole::dense_mlp) {
      ++(t.name.find(".shared_expert") != std::string::npos ? lora_shared_modules
                                                            : lora_dense_modules);
      lora_dense_bwd = std::max(lora_dense_bwd, bwd);
    }
    if (t.role == HfRole::expert) {
      const std::string m = hf_module_of(t.name);
      (m.ends_with("down_proj") || m.ends_with(".w2") ? lora_w2 : lora_w13) = true;
    }
  }
  // W13 parts the shards do not hold back to back are one copy each, at the
  // stored width, instead of a view (model/checkpoint.h).
  if (keep_stored) {
    const size_t copied = size_t(stored->copied_w13) * dtype_size(stored->dtype);
    at(p, MemTag::mapped) -= copied;
    at(p, MemTag::weights) += copied;
  }
  // Frozen experts (their adapters' branches beside them) run on the grouped kernels, which keep
  // packed copies of every MoE layer's stacks (moe/expert_kernels.h) under
  // `weights`, at the run's width: when the experts' weights are stored as
  // the run computes or as bf16 in an f32 run (widened while packing), on a
  // TierMoE ISA, and while the packs fit ExpertPacks' rule, which each layer
  // applies at its first pack to the memory left then (here: what is
  // available now, less the plan's own bytes so far and the layers packed
  // before it).
  // Quantized experts run on the grouped kernels too, read as stored.
  const bool low_width = quantized || mxfp4_kept || stored_kept;
  const bool packable = low_width || !keep_stored || PackedWeights::reads(stored->dtype, dt);
  const bool grouped = lora && El > 0 && ExpertPacks::computes_in(dt) && packable;
  int64_t packed_layers = 0;
  if (grouped) {
    const uint64_t stack =
        uint64_t(El) * uint64_t(3 * c.moe_intermediate_size * c.hidden_size) * z.s;
    const uint64_t packs =
        uint64_t(ExpertPacks::packed_bytes(El, c.hidden_size, c.moe_intermediate_size, false, dt));
    uint64_t left = host_memory_available();
    for (size_t b : p.peak) left -= std::min<uint64_t>(left, b);
    for (int64_t l = 0;
         l < c.num_moe_layers() && (low_width || ExpertPacks::packs_fit(stack, left)); ++l) {
      if (low_width) {
        ++packed_layers;
        continue;
      }
      at(p, MemTag::weights) += packs;
      left -= std::min(left, packs);
      ++packed_layers;
    }
  }
  at(p, MemTag::grads) = size_t(trainable) * master;
  // A router holds its gradient buffer even while frozen (moe/router.h).
  if (lora && c.num_experts > 0) {
    at(p, MemTag::grads) += size_t(c.num_moe_layers() * c.num_experts * c.hidden_size) * master;
  }
  const int64_t passes = cfg.trainer.grad_accum / std::max(ranks, 1);
  // Folding several micro-batches keeps a sum beside the replicated gradients.
  if (passes > 1) at(p, MemTag::grads) += size_t(replicated_trainable) * master;
  size_t opt_per_param = cfg.trainer.optimizer == OptimizerKind::adamw ? 2 * master
                         : cfg.trainer.sgd.momentum != 0               ? master
                                                                       : 0;
  if (!lora && dt == DType::bf16) opt_per_param += 4;  // the fp32 master copy
  at(p, MemTag::optimizer) = size_t(trainable) * opt_per_param;
  if (cfg.tier.enabled()) {
    // The layouts the experts are held in on the host; a device that holds
    // quantized weights (the CPU device) keeps them so, the CUDA device
    // widened (tier_session.cpp).
    std::optional<ExpertQuant> quant;
    auto both = [](QuantLayout l) { return ExpertQuant{l, l}; };
    if (quantized) quant = both({*cfg.experts, cfg.experts_group, 1, true});
    if (mxfp4_kept) quant = both({QuantFormat::mxfp4, 32, 1, false});
    if (stored_kept && *stored->experts_format == QuantFormat::fp8) {
      // Gate stacked over up keeps 128-row scale blocks only on whole blocks.
      const int64_t w13_rows = c.moe_intermediate_size % 128 == 0 ? 128 : 1;
      quant = ExpertQuant{{QuantFormat::fp8, 128, w13_rows, false},
                          {QuantFormat::fp8, 128, 128, false}};
    } else if (stored_kept) {
      quant = both({*stored->experts_format, stored->experts_group, 1, false});
    }
    if (parse_device_choice(cfg.tier.device, "--device").kind == DeviceChoice::Kind::cuda) {
      quant.reset();
    }
    at(p, MemTag::device) =
        planned_device_bytes(c, dt, El, quant, lora, size_t(cfg.tier.device_memory));
  }

  // Activations and saved, for one micro-batch.
  const int64_t layers = c.num_hidden_layers;
  const int64_t moe_layers = c.num_experts > 0 ? c.num_moe_layers() : 0;
  const int64_t dense_layers = layers - moe_layers;
  const int64_t lora_dense_per_layer = dense_layers ? lora_dense_modules / dense_layers : 0;
  const int64_t lora_shared_per_layer = moe_layers ? lora_shared_modules / moe_layers : 0;
  // The shared expert (region `shared`) keeps its record or replays it in backward.
  const RematPolicy remat = RematPolicy::parse(cfg.remat, "--remat");
  const bool shared_kept = remat.saves(MoeRegion::shared);
  const int64_t lora_shared_kept = shared_kept ? lora_shared_per_layer : 0;
  size_t kept = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const bool moe = c.num_experts > 0 && c.is_moe_layer(l);
    kept += layer_kept(z, c, l, moe, lora_attn_of[size_t(l)],
                       moe ? lora_shared_kept : lora_dense_per_layer, shared_kept);
  }
  if (dt == DType::f64) {
    // f64 LoRA intermediates are twice the fp32 ones layer_kept counted.
    kept += size_t(z.N) * z.R * 4 *
            size_t(lora_attn_modules + lora_dense_modules + lora_shared_kept * moe_layers);
  }
  kept += size_t(z.N) * z.D * z.s;      // the last layer's output (the final norm's input)
  kept += 2 * size_t(z.N) * c.rotary_dim() * z.s;       // RoPE cos and sin
  kept += size_t(z.N) * z.D * z.s + size_t(z.N) * z.a;  // final norm output and rstd
  // Matrices stored narrower than the run (a mapped bf16 checkpoint in an f32
  // run) add a *_mixed product's scratch to each transient below: the LM
  // head's, and the largest dx product's in attention and the dense MLP; per
  // thread in the per-expert products.
  auto mixed_dx = [&](int64_t rows, std::initializer_list<std::pair<int64_t, int64_t>> out_in) {
    size_t b = 0;
    for (auto [out, in] : out_in) b = std::max(b, cpu::mixed_scratch_bytes(rows, out, in, dt));
    return mixed ? b : 0;
  };
  // The LM head: dn, a chunk's logits and their gradient, and the scratch of
  // the head's products (forward, then dx).
  const int64_t C = cfg.lm_head_chunk == 0 ? z.N : std::min(cfg.lm_head_chunk, z.N);
  const size_t head = size_t(z.N) * z.D * z.s + 2 * size_t(C) * z.V * z.s +
                      (mixed ? std::max(cpu::mixed_scratch_bytes(C, z.D, z.V, dt),
                                        cpu::mixed_scratch_bytes(C, z.V, z.D, dt))
                             : 0);
  // A layer's backward. The MLP half: dx, dprev and dm on the residual
  // stream, then the MoE's dy and dx rows, their d scores and one expert's
  // buffers at a time per thread (dy, da, dh, the scaled input; with LoRA
  // their fp32 branch gradients), for an expert of up to twice the even
  // share of rows (routing is skewed); or the dense MLP's da and dh. The
  // attention half: dh and dn on top, then do, dq/dk/dv (and the pre-norm ones).
  const size_t ND = size_t(z.N) * z.D * z.s, NK = size_t(z.N * z.K);
  const int64_t HP = z.H * z.P, KP = z.Hkv * z.P;
  // The attention kernel's own scratch (packed keys and values, per-head
  // partial dk and dv) lives while do and dq/dk/dv do, before the pre-norm
  // gradients, the projections' LoRA branches and mixed-width scratch.
  size_t attn_bwd = 0;
  if (c.mla()) {
    // do, dq, dk and dv; then, until the block's backward returns, the rope
    // dims' and the shared key's gradients, dkv_a, dkv, and each latent's
    // gradient after and before its norm (model/mla_attention.cpp).
    const int64_t Q = c.qk_head_dim(), Pv = c.v_head_dim, Qr = c.qk_rope_head_dim;
    const int64_t Rq = c.q_lora_rank, Rkv = c.kv_lora_rank, HQ = z.H * Q, HV = z.H * Pv;
    const int64_t q_out = Rq > 0 ? Rq : HQ;
    const size_t after =
        size_t(z.N) *
            (z.H * Qr + 2 * Qr + Rkv + z.H * (c.qk_nope_head_dim + Pv) + 2 * Rkv + 2 * Rq) * z.s +
        size_t(z.N * lora_attn_bwd) * master +
        std::max(
            mixed_dx(
                z.N,
                {{q_out, z.D}, {Rkv + Qr, z.D}, {z.H * (c.qk_nope_head_dim + Pv), Rkv}, {z.D, HV}}),
            Rq > 0 ? mixed_dx(z.N, {{HQ, Rq}}) : size_t(0));
    attn_bwd = 5 * ND + size_t(z.N) * 2 * (HQ + HV) * z.s +
               std::max(after, cpu::attention_backward_scratch_bytes(B, L, z.H, z.H, Q, Pv, dt));
  } else {
    // The output gate's (Qwen3.5): the gradients of its input and of what it
    // gates, and q_proj's [q | gate] gradient at the end.
    const bool gate = c.spec().attention_output_gate;
    const size_t after = size_t(z.N) * (c.qk_norm() == QkNorm::none ? 0 : HP + KP) * z.s +
                         size_t(z.N) * (gate ? 2 * HP : 0) * z.s +
                         size_t(z.N * lora_attn_bwd) * master +
                         mixed_dx(z.N, {{(gate ? 2 : 1) * HP, z.D}, {KP, z.D}, {z.D, HP}});
    attn_bwd =
        5 * ND + size_t(z.N) * (HP + HP + 2 * KP + (gate ? 2 * HP : 0)) * z.s +
        std::max(after, cpu::attention_backward_scratch_bytes(B, L, z.H, z.Hkv, z.P, z.P, dt));
  }
  if (c.spec().attention == AttentionKind::hybrid_linear) {
    // A Gated DeltaNet layer's backward holds every gradient it makes until
    // it returns (model/gated_deltanet.cpp): of the output, h and its
    // [z | h] pair, of z, h and the rule's output, of q, k (after and before
    // their l2 norms) and v, of the gates' inputs, the conv's output and
    // input. (The chunked rule's own scratch, a row's chunks and their
    // first states per thread, is a few MB outside the tagged allocator.)
    const int64_t Kw = c.linear_key_width(), Hv = c.linear_num_value_heads;
    const int64_t Vw = c.linear_value_width(), C = c.linear_conv_width();
    const size_t gdn = 5 * ND + size_t(z.N) * (8 * Vw + 4 * Kw + 2 * C + 2 * Hv) * z.s +
                       size_t(z.N) * 2 * Hv * z.a + size_t(z.N * lora_attn_bwd) * master +
                       mixed_dx(z.N, {{C, z.D}, {Vw, z.D}, {z.D, Vw}});
    attn_bwd = std::max(attn_bwd, gdn);
  }
  size_t mlp_bwd = 0;
  if (moe_layers) {
    const size_t rows = std::min(NK, 2 * ((NK + size_t(z.E) - 1) / size_t(z.E)));
    const size_t lora_rows = (lora_w13 || lora_w2) ? rows * size_t(z.D + z.F) * 2 * 4 : 0;
    const size_t one_expert = rows * size_t(z.D + 4 * z.F) * z.s + lora_rows +
                              mixed_dx(int64_t(rows), {{2 * z.F, z.D}, {z.D, z.F}});
    // The grouped backward holds da and dh for all NK rows at once instead.
    const size_t experts_bwd = packed_layers > 0 ? NK * size_t(3 * z.F) * z.s
                                                 : size_t(std::max(1, num_threads())) * one_expert;
    // The router's backward comes after the experts': its logits' gradient
    // beside the top-k weights' and, in a bf16 run, dx and W widened to fp32
    // (moe/router.cpp).
    const size_t router_bwd =
        size_t(z.N * (z.E + z.K)) * z.a + (dt == DType::bf16 ? size_t((z.N + z.E) * z.D) * 4 : 0);
    mlp_bwd = 3 * ND + 2 * NK * z.D * z.s + 2 * NK * z.a + std::max(experts_bwd, router_bwd);
  }
  if (dense_layers) {
    mlp_bwd = std::max(mlp_bwd, 3 * ND + size_t(z.N) * 3 * z.I * z.s +
                                    size_t(z.N * lora_dense_bwd) * master +
                                    mixed_dx(z.N, {{2 * z.I, z.D}, {z.D, z.I}}));
  }
  if (moe_layers && c.has_shared_expert()) {
    // After the routed experts' backward: the shared expert's dm and its
    // MLP's da and dh, over the MoE half's dx, dprev and dm.
    const int64_t S = c.shared_expert_intermediate_size;
    // Replayed, its record (h, a, m, s and LoRA u) lives through its backward.
    const size_t replayed = shared_kept ? 0
                                        : size_t(z.N) * (z.D + 3 * S) * z.s + size_t(z.N) * z.a +
                                              size_t(z.N) * z.R * 4 * size_t(lora_shared_per_layer);
    mlp_bwd = std::max(mlp_bwd, 4 * ND + replayed + size_t(z.N) * 3 * S * z.s +
                                    size_t(z.N * lora_dense_bwd) * master +
                                    mixed_dx(z.N, {{2 * S, z.D}, {z.D, S}}));
  }
  at(p, MemTag::activations) = kept + std::max({head, attn_bwd, mlp_bwd});

  if (moe_layers) {
    const AbsorbScores absorb = parse_absorb_scores(cfg.absorb, "--absorb-scores");
    const bool absorbed = absorb != AbsorbScores::off;  // no TierMoE model has a postprocess
    const MoeRematPlan rp = MoeRematPlan::make(remat.moe_keep(), absorbed,
                                               /*weight_grads=*/!lora, /*post_norm=*/false,
                                               ExpertAdapted{lora_w13, lora_w2});
    const MoeSavedBytes m = moe_saved(z, rp, absorbed, lora_w13, lora_w2);
    at(p, MemTag::saved) = size_t(moe_layers) * m.kept + m.replay;
  }
  return p;
}

std::string MemoryPlan::table(const std::array<size_t, kNumMemTags>* measured) const {
  std::ostringstream o;
  for (size_t i = 0; i < kNumMemTags; ++i) {
    char ratio[32] = "";
    if (measured && (*measured)[i] > 0) {
      std::snprintf(ratio, sizeof ratio, " (%.3fx)", double(peak[i]) / double((*measured)[i]));
    }
    o << "  " << mem_tag_name(MemTag(i)) << ": " << human(peak[i]);
    if (measured) o << ", measured " << human((*measured)[i]) << ratio;
    o << "\n";
  }
  o << "  total: " << human(total()) << " (" << total() << " bytes)\n";
  return o.str();
}

nlohmann::json MemoryPlan::to_json(const std::array<size_t, kNumMemTags>* measured) const {
  nlohmann::json j = {{"total", total()}};
  for (size_t i = 0; i < kNumMemTags; ++i) {
    nlohmann::json t = {{"predicted", peak[i]}};
    if (measured) t["measured"] = (*measured)[i];
    j[std::string(mem_tag_name(MemTag(i)))] = t;
  }
  return j;
}

std::vector<std::string> ways_to_fit(const TrainConfig& config, const ModelConfig& model,
                                     std::optional<StoredMatrices> stored, int ranks,
                                     size_t limit) {
  std::vector<std::pair<size_t, std::string>> fits;
  auto consider = [&](TrainConfig c, std::string what) {
    const size_t t = plan_memory(c, model, stored, ranks).total();
    if (t <= limit) fits.emplace_back(t, what + " (" + human(t) + ")");
  };
  for (const char* policy : {"default", "full"}) {
    if (config.remat == policy) continue;
    TrainConfig c = config;
    c.remat = policy;
    consider(c, str_of("--remat ", policy));
  }
  for (int64_t b = config.trainer.batch / 2; b >= 1; b /= 2) {
    TrainConfig c = config;
    c.trainer.batch = b;
    c.trainer.grad_accum = config.trainer.grad_accum * (config.trainer.batch / b);
    consider(c, str_of("--batch ", b, " --grad-accum ", c.trainer.grad_accum));
    if (b == 1) break;
  }
  if (!config.lora) {
    TrainConfig c = config;
    c.lora = LoraConfig{};
    consider(c, "LoRA instead of full fine-tuning (--lora-rank 8)");
  }
  // The frozen routed experts at 4 bits (a LoRA run's; f32 and bf16).
  if (config.lora && !config.experts && model.num_experts > 0 && config.dtype != DType::f64) {
    TrainConfig c = config;
    c.experts = QuantFormat::int4;
    consider(c, "the routed experts at 4 bits (--experts int4)");
  }
  if (config.dtype == DType::f32 && !config.lora) {
    TrainConfig c = config;
    c.dtype = DType::bf16;
    consider(c, "--dtype bf16");
  }
  std::sort(fits.begin(), fits.end());
  std::vector<std::string> out;
  for (auto& [t, s] : fits) out.push_back(std::move(s));
  return out;
}

}  // namespace tiermoe
