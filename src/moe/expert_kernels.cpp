#include "tiermoe/moe/expert_kernels.h"

#include <algorithm>
#include <chrono>

#include "tiermoe/core/bounds.h"

#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/expert_math.h"

namespace tiermoe {

namespace {

// Expert e's W13 ([2F, D]) or W2 ([D, F]) as stored: a slice of the stacks,
// or the tensor bound for it alone (a checkpoint's per-expert weights).
std::vector<Tensor> expert_weights(const GroupedExperts& experts, bool w13) {
  std::vector<Tensor> w(size_t(experts.config().num_experts));
  for (size_t e = 0; e < w.size(); ++e) {
    TIERMOE_CHECK(experts.weights_bound(int64_t(e)),
                  detail::str_of("expert ", e, "'s weights are packed before they were bound"),
                  experts.name(), "bind_weights or bind_expert_weights before the first forward");
    const ExpertWeights ew = experts.weights(int64_t(e));
    w[e] = w13 ? ew.w13_FD : ew.w2_DF;
  }
  return w;
}

}  // namespace

bool ExpertPacks::applies(const GroupedExperts& experts) {
  const ExpertsConfig& cfg = experts.config();
  const DType dt = experts.dtype();
  if (!experts.packs().enabled() || cfg.kernels != KernelSet::cpu || !computes_in(dt) ||
      cfg.post_norm || cfg.num_experts == 0) {
    return false;
  }
  if (experts.quantized()) return true;  // read as stored: no packed copies to fit
  const ExpertWeights w = experts.weights(0);
  return w.w13_FD.defined() && w.w2_DF.defined() && PackedWeights::reads(w.w13_FD.dtype(), dt) &&
         PackedWeights::reads(w.w2_DF.dtype(), dt) && experts.packs().fits_host_memory(experts);
}

bool ExpertPacks::computes_in(DType dt) {
  return (dt == DType::f32 || dt == DType::bf16) && cpu_isa() != CpuIsa::onednn;
}

bool ExpertPacks::fits_host_memory(const GroupedExperts& experts) {
  std::lock_guard lock(mutex_);
  if (!checked_) {
    // The stacks' bytes at the products' width: what the packs copy.
    const ExpertsConfig& cfg = experts.config();
    const uint64_t stacks = uint64_t(cfg.num_experts) * uint64_t(3 * cfg.ffn * cfg.hidden) *
                            dtype_size(experts.dtype());
    // MemAvailable counts a mapped checkpoint's resident pages as free to
    // reclaim, but the run reads them every step: they are not the packs'.
    const uint64_t available = host_memory_available();
    const uint64_t mapped = MemoryTracker::process().live(MemTag::mapped);
    refused_ = !packs_fit(stacks, available - std::min(available, mapped));
    checked_ = true;
  }
  return !refused_;
}

bool ExpertPacks::packs_fit(uint64_t stack_bytes, uint64_t available) {
  // Four packs: W13 and W2, each in a forward and a dx layout, of about the
  // stack's bytes each (bf16 stays bf16, f32 stays f32); a panel's zero
  // padding adds a few percent, hence the quarter on top.
  const uint64_t need = 2 * stack_bytes + stack_bytes / 4;
  return need <= available / 2;
}

int64_t ExpertPacks::packed_bytes(int64_t experts, int64_t D, int64_t F, bool gpt_oss, DType dt) {
  const Glu glu{gpt_oss ? GluKind::clamped : GluKind::swiglu};
  return PackedWeights::storage_bytes(experts, 2 * F, D, dt, PackUse::forward_glu, glu) +
         PackedWeights::storage_bytes(experts, D, F, dt, PackUse::forward) +
         PackedWeights::storage_bytes(experts, 2 * F, D, dt, PackUse::backward_dx) +
         PackedWeights::storage_bytes(experts, D, F, dt, PackUse::backward_dx);
}

const PackedWeights& ExpertPacks::get(const GroupedExperts& experts, ExpertPack which) {
  std::lock_guard lock(mutex_);
  Slot& s = slots_[int(which)];
  const uint64_t version = experts.weights_version();
  if (s.valid && s.version == version && s.w.isa() == cpu_isa()) return s.w;
  const auto start = std::chrono::steady_clock::now();
  const ExpertsConfig& cfg = experts.config();
  Glu glu;
  if (cfg.activation == ExpertActivation::gpt_oss) {
    glu = Glu{GluKind::clamped, cfg.gpt_oss.alpha, cfg.gpt_oss.limit};
  }
  stats_.bytes -= s.w.bytes();
  const DType dt = experts.dtype();
  if (experts.quantized()) {
    const bool w13 = which == ExpertPack::w13_glu || which == ExpertPack::w13_dx;
    std::vector<QuantMatrix> q(size_t(cfg.num_experts));
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      q[size_t(e)] = w13 ? experts.quantized_w13(e) : experts.quantized_w2(e);
    }
    const PackUse use = which == ExpertPack::w13_glu ? PackUse::forward_glu
                        : which == ExpertPack::w2    ? PackUse::forward
                                                     : PackUse::backward_dx;
    s.w.bind_quantized(std::move(q), dt, use, glu);
  } else {
    switch (which) {
      case ExpertPack::w13_glu:
        s.w.pack(expert_weights(experts, true), dt, PackUse::forward_glu, glu);
        break;
      case ExpertPack::w2:
        s.w.pack(expert_weights(experts, false), dt, PackUse::forward);
        break;
      case ExpertPack::w13_dx:
        s.w.pack(expert_weights(experts, true), dt, PackUse::backward_dx);
        break;
      case ExpertPack::w2_dx:
        s.w.pack(expert_weights(experts, false), dt, PackUse::backward_dx);
        break;
    }
  }
  stats_.bytes += s.w.bytes();
  stats_.packs += 1;
  stats_.seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  s.version = version;
  s.valid = true;
  return s.w;
}

ExpertPackStats ExpertPacks::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

namespace {

Tensor param_or_none(const GroupedExperts& ex, const char* name, bool has) {
  return has ? ex.param(name) : Tensor();
}

Tensor rows_or_none(const Tensor& t, int64_t b, int64_t e) {
  return t.defined() ? t.rows(b, e) : Tensor();
}

}  // namespace

namespace {

Tensor rows_of_expert(const Tensor& t, const std::vector<int64_t>& offset_E, int64_t e) {
  return t.rows(offset_E[size_t(e)], offset_E[size_t(e) + 1]);
}

// An adapter's gate/up branches added to W13's output h (bias included), and
// the activation and W2's input rebuilt from it: the per-expert path's order
// (expert_w13_forward, expert_act_forward, expert_w2_forward's scaling), so
// the bits are that path's.
void adapt_w13_forward(const GroupedExperts& experts, ExpertRowsActs& all, Tensor& w2_in,
                       const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                       const Tensor& score_N, const std::vector<uint8_t>& skip_E) {
  const ExpertAdapter& ad = *experts.adapter();
  for_each_expert(
      offset_E,
      [&](int64_t e) {
        auto rows = [&](const Tensor& t) { return rows_of_expert(t, offset_E, e); };
        Tensor h = rows(all.h_M2F), a = rows(all.a_MF), x = rows(x_ND);
        for (auto [p, u] : {std::pair{ExpertLinear::gate, &all.lora_gate_MR},
                            std::pair{ExpertLinear::up, &all.lora_up_MR}}) {
          if (!ad.adapts(p)) continue;
          Tensor u_rows = rows(*u);
          ad.forward_rows(p, e, h, u_rows, x);
        }
        expert_act_forward(experts.math_without_matrices(e), a, h);
        if (score_N.defined()) {
          Tensor in = rows(w2_in);
          scale_rows_forward(in, a, rows(score_N));
        }
      },
      skip_E);
}

// The down adapter's branch added to W2's output.
void adapt_w2_forward(const GroupedExperts& experts, Tensor& y_ND, ExpertRowsActs& all,
                      const Tensor& w2_in, const std::vector<int64_t>& offset_E,
                      const std::vector<uint8_t>& skip_E) {
  const ExpertAdapter& ad = *experts.adapter();
  for_each_expert(
      offset_E,
      [&](int64_t e) {
        Tensor y = rows_of_expert(y_ND, offset_E, e);
        Tensor u = rows_of_expert(all.lora_down_MR, offset_E, e);
        ad.forward_rows(ExpertLinear::down, e, y, u, rows_of_expert(w2_in, offset_E, e));
      },
      skip_E);
}

}  // namespace

void grouped_experts_forward(const GroupedExperts& experts, Tensor& y_ND, ExpertRowsActs& all,
                             const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                             const Tensor& score_N, const std::vector<uint8_t>& skip_E) {
  const ExpertsConfig& cfg = experts.config();
  const int64_t N = x_ND.size(0), F = cfg.ffn;
  if (N == 0) return;
  ExpertPacks& packs = experts.packs();
  const PackedWeights& w13 = packs.get(experts, ExpertPack::w13_glu);
  const PackedWeights& w2 = packs.get(experts, ExpertPack::w2);
  const ExpertAdapter* ad = experts.adapter();
  // W2's input: the activation scaled by the score (absorbed), else itself.
  Tensor w2_in = score_N.defined() ? Tensor::empty({N, F}, experts.dtype()) : all.a_MF;
  cpu::grouped_glu_forward(all.h_M2F, all.a_MF, w2_in, x_ND, offset_E, w13,
                           param_or_none(experts, "b13", cfg.bias), score_N, skip_E);
  // An adapter's gate/up branches change h: its activation is taken again
  // (elementwise: a small cost beside the products the grouped kernels save).
  if (ad && (ad->adapts(ExpertLinear::gate) || ad->adapts(ExpertLinear::up))) {
    adapt_w13_forward(experts, all, w2_in, x_ND, offset_E, score_N, skip_E);
  }
  cpu::grouped_matmul(y_ND, w2_in, offset_E, w2, param_or_none(experts, "b2", cfg.bias), score_N,
                      skip_E);
  if (ad && ad->adapts(ExpertLinear::down))
    adapt_w2_forward(experts, y_ND, all, w2_in, offset_E, skip_E);
}

void grouped_experts_backward(GroupedExperts& experts, Tensor& dx_ND, Tensor& dscore_N,
                              const Tensor& dy_ND, const ExpertRowsActs& all,
                              const std::vector<int64_t>& offset_E, const Tensor& score_N,
                              bool weight_grads, const std::vector<uint8_t>& skip_E) {
  const ExpertsConfig& cfg = experts.config();
  const int64_t N = dy_ND.size(0), F = cfg.ffn;
  if (N == 0) return;
  const DType dt = experts.dtype();
  ExpertPacks& packs = experts.packs();
  const PackedWeights& w2_dx = packs.get(experts, ExpertPack::w2_dx);
  const PackedWeights& w13_dx = packs.get(experts, ExpertPack::w13_dx);
  const bool absorbed = score_N.defined();
  TIERMOE_CHECK(!weight_grads || all.x_MD.defined(),
                "weight gradients need the expert inputs x_ND, which forward did not keep",
                experts.name(), "run forward with weight_grads = true");
  TIERMOE_CHECK(!(weight_grads || absorbed) || all.a_MF.defined(),
                "this backward needs the activation a_NF, which forward did not keep",
                experts.name(), "keep a_NF (or rebuild it by replay) for weight grads or absorbed scores");
  ExpertAdapter* ad = experts.adapter();
  const bool lora_w13 = all.lora_gate_MR.defined() || all.lora_up_MR.defined();
  const bool lora_down = all.lora_down_MR.defined();
  TIERMOE_CHECK(!lora_w13 || all.x_MD.defined(),
                "the gate/up adapters' backward needs the expert inputs x_ND", experts.name(),
                "keep x_ND (or rebuild it by replay) when the experts carry gate/up adapters");
  TIERMOE_CHECK(!lora_down || all.a_MF.defined(),
                "the down adapter's backward needs the activation a_NF", experts.name(),
                "keep a_NF (or rebuild it by replay) when the experts carry a down adapter");
  // Expert e's view of the call: its rows of the saves, scores, dscore.
  struct Rows {
    ExpertMath m;
    ExpertRowsActs acts;
    Tensor score, dscore;
  };
  auto rows_of = [&](int64_t e) {
    const int64_t b = offset_E[size_t(e)], end = offset_E[size_t(e) + 1];
    Rows r{experts.math_without_matrices(e), {}, {}, {}};
    r.acts.x_MD = rows_or_none(all.x_MD, b, end);
    r.acts.h_M2F = all.h_M2F.rows(b, end);
    r.acts.a_MF = rows_or_none(all.a_MF, b, end);
    if (absorbed) r.score = score_N.rows(b, end), r.dscore = dscore_N.rows(b, end);
    return r;
  };
  // One side of every expert's backward: side(e, r, sum) computes it (with
  // its weight-gradient sum when asked), and that side's sum, complete after
  // this call's rows in the rule's blocks, is added to e's grads once, as
  // backward_rows adds it; one expert's scratch sum alive per thread.
  auto each_expert = [&](auto side, auto part_of) {
    for_each_expert(
        offset_E,
        [&](int64_t e) {
          Rows r = rows_of(e);
          ExpertGrads sum =
              weight_grads ? ExpertGrads::empty(cfg, experts.grad_dtype()) : ExpertGrads();
          side(e, r, weight_grads ? &sum : nullptr);
          if (weight_grads) experts.grads(e).add(part_of(sum));
        },
        skip_E);
  };
  auto rows = [&](const Tensor& t, int64_t e) {
    return t.rows(offset_E[size_t(e)], offset_E[size_t(e) + 1]);
  };
  each_expert(
      [&](int64_t e, Rows& r, ExpertGrads* sum) {
        expert_backward_w2_side(r.m, r.dscore, rows(dy_ND, e), r.acts, r.score, sum, false, false);
      },
      [](const ExpertGrads& sum) {
        ExpertGrads part;
        part.dw2_DF = sum.dw2_DF, part.db2_D = sum.db2_D;
        return part;
      });
  Tensor da_NF = Tensor::empty({N, F}, dt);
  cpu::grouped_matmul(da_NF, dy_ND, offset_E, w2_dx, Tensor(), Tensor(), skip_E);
  // The adapters' backward at the per-expert path's points (expert_backward):
  // down's into da before the activation's backward, gate's and up's into dx
  // after W13's.
  if (lora_down) {
    for_each_expert(
        offset_E,
        [&](int64_t e) {
          Tensor w2_in = rows(all.a_MF, e);  // W2's input, rebuilt as expert_backward_w2_side does
          if (absorbed) {
            w2_in = Tensor::empty(w2_in.shape(), dt);
            scale_rows_forward(w2_in, rows(all.a_MF, e), rows(score_N, e));
          }
          Tensor da = rows(da_NF, e);
          ad->backward_rows(ExpertLinear::down, e, da, rows(dy_ND, e), w2_in,
                            rows(all.lora_down_MR, e));
        },
        skip_E);
  }
  Tensor dh_N2F = Tensor::empty({N, 2 * F}, dt);
  each_expert(
      [&](int64_t e, Rows& r, ExpertGrads* sum) {
        Tensor dh = rows(dh_N2F, e), da = rows(da_NF, e);
        expert_backward_w13_side(r.m, dh, r.dscore, da, r.acts, r.score, sum, false);
      },
      [](const ExpertGrads& sum) {
        ExpertGrads part;
        part.dw13_FD = sum.dw13_FD, part.db13_F = sum.db13_F;
        return part;
      });
  cpu::grouped_matmul(dx_ND, dh_N2F, offset_E, w13_dx, Tensor(), Tensor(), skip_E);
  if (lora_w13) {
    for_each_expert(
        offset_E,
        [&](int64_t e) {
          Tensor dx = rows(dx_ND, e), dh = rows(dh_N2F, e), x = rows(all.x_MD, e);
          if (all.lora_gate_MR.defined()) {
            ad->backward_rows(ExpertLinear::gate, e, dx, dh, x, rows(all.lora_gate_MR, e));
          }
          if (all.lora_up_MR.defined()) {
            ad->backward_rows(ExpertLinear::up, e, dx, dh, x, rows(all.lora_up_MR, e));
          }
        },
        skip_E);
  }
}

}  // namespace tiermoe
