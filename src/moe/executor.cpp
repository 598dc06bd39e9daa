#include "tiermoe/moe/executor.h"

#include <algorithm>
#include <exception>
#include <mutex>

#include "tiermoe/core/parallel.h"
#include "tiermoe/moe/expert_kernels.h"

namespace tiermoe {

void for_each_expert(const std::vector<int64_t>& offset_E, const std::function<void(int64_t)>& fn,
                     const std::vector<uint8_t>& skip_E) {
  const int64_t E = int64_t(offset_E.size()) - 1;
  TIERMOE_ASSERT(skip_E.empty() || int64_t(skip_E.size()) == E);
  std::vector<int64_t> order;
  for (int64_t e = 0; e < E; ++e) {
    if (!skip_E.empty() && skip_E[size_t(e)]) continue;
    if (offset_E[size_t(e) + 1] > offset_E[size_t(e)]) order.push_back(e);
  }
  auto rows = [&](int64_t e) { return offset_E[size_t(e) + 1] - offset_E[size_t(e)]; };
  // Largest first, so a skewed routing does not leave one big expert to the end.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return rows(a) > rows(b); });
  const int threads = std::min<int64_t>(num_threads(), int64_t(order.size()));
  if (threads <= 1 || omp_in_parallel()) {
    for (int64_t e : order) fn(e);
    return;
  }
  // Each expert's rows are independent of the others', so the schedule
  // changes no result; exceptions cannot cross the OpenMP region, so the
  // first one is carried out and rethrown.
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (size_t i = 0; i < order.size(); ++i) {
    try {
      fn(order[i]);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

namespace {

void check_rows_layout(const std::vector<int64_t>& offset_E, int64_t E, int64_t N,
                       const std::string& who) {
  TIERMOE_CHECK(int64_t(offset_E.size()) == E + 1 && offset_E.front() == 0 &&
                    offset_E.back() == N && std::is_sorted(offset_E.begin(), offset_E.end()),
                detail::str_of("offset_E must hold E+1 = ", E + 1,
                               " ascending offsets from 0 to N = ", N),
                who, "pass the DispatchPlan's offset_E for these rows");
}

// One expert's rows of whatever `saved` holds (x_ND only when with_x, the
// adapter's intermediates only when with_lora).
ExpertRowsActs rows_of(const SavedTensors& saved, bool post_norm, bool with_x, bool with_lora,
                       int64_t b, int64_t e) {
  ExpertRowsActs acts;
  if (with_x) acts.x_MD = saved.get("x_ND").rows(b, e);
  acts.h_M2F = saved.get("h_N2F").rows(b, e);
  if (saved.has("a_NF")) acts.a_MF = saved.get("a_NF").rows(b, e);
  if (post_norm) {
    acts.ypre_MD = saved.get("ypre_ND").rows(b, e);
    acts.rstd_M = saved.get("rstd_N").rows(b, e);
  }
  if (with_lora) {
    if (saved.has("lora_gate_NR")) acts.lora_gate_MR = saved.get("lora_gate_NR").rows(b, e);
    if (saved.has("lora_up_NR")) acts.lora_up_MR = saved.get("lora_up_NR").rows(b, e);
    if (saved.has("lora_down_NR")) acts.lora_down_MR = saved.get("lora_down_NR").rows(b, e);
  }
  return acts;
}

// The adapter's intermediates of one expert's rows, [b, e) of the N-row buffers.
void lora_rows(ExpertRowsActs& acts, const ExpertRowsActs& all, int64_t b, int64_t e) {
  if (all.lora_gate_MR.defined()) acts.lora_gate_MR = all.lora_gate_MR.rows(b, e);
  if (all.lora_up_MR.defined()) acts.lora_up_MR = all.lora_up_MR.rows(b, e);
  if (all.lora_down_MR.defined()) acts.lora_down_MR = all.lora_down_MR.rows(b, e);
}

// A kept activation goes into the record; a dropped one is a scratch buffer
// that dies with the forward.
Tensor keep_or_scratch(SavedTensors& saved, bool keep, const char* name, Shape shape, DType dt) {
  if (keep) return saved.alloc(name, std::move(shape), dt);
  return Tensor::empty(std::move(shape), dt, MemTag::activations, saved.tracker());
}

}  // namespace

ExpertAdapted HostExperts::adapted() const {
  return {experts_->adapts(ExpertLinear::gate) || experts_->adapts(ExpertLinear::up),
          experts_->adapts(ExpertLinear::down)};
}

void HostExperts::check_forward(const Tensor& y_ND, const Tensor& x_ND,
                                const std::vector<int64_t>& offset_E, const Tensor& score_N) const {
  const ExpertsConfig& cfg = experts_->config();
  const int64_t N = x_ND.size(0), D = cfg.hidden;
  const DType dt = experts_->dtype();
  check_shape(x_ND, {N, D}, name() + ": x_ND");
  check_dtype(x_ND, dt, name() + ": x_ND");
  check_shape(y_ND, {N, D}, name() + ": y_ND");
  check_dtype(y_ND, dt, name() + ": y_ND");
  check_rows_layout(offset_E, cfg.num_experts, N, name());
  if (score_N.defined()) {
    check_shape(score_N, {N}, name() + ": score_N");
    TIERMOE_CHECK(!cfg.post_norm, "router scores cannot be absorbed before W2 with post_norm",
                  name(), "the postprocess is scale-invariant; combine must apply the score");
  }
}

ExpertRowsActs HostExperts::forward_buffers(SavedTensors& saved, const Tensor& x_ND,
                                            const ExpertSaves& keep) {
  const ExpertsConfig& cfg = experts_->config();
  const int64_t N = x_ND.size(0), D = cfg.hidden, F = cfg.ffn;
  const DType dt = experts_->dtype();
  if (keep.x) saved.save("x_ND", x_ND);
  ExpertRowsActs all;
  all.h_M2F = keep_or_scratch(saved, keep.h, "h_N2F", {N, 2 * F}, dt);
  all.a_MF = keep_or_scratch(saved, keep.a, "a_NF", {N, F}, dt);
  if (cfg.post_norm) {
    all.ypre_MD = keep_or_scratch(saved, keep.w2, "ypre_ND", {N, D}, dt);
    all.rstd_M = keep_or_scratch(saved, keep.w2, "rstd_N", {N}, experts_->grad_dtype());
  }
  if (ExpertAdapter* ad = experts_->adapter()) {
    const Shape u{N, ad->rank()};
    if (ad->adapts(ExpertLinear::gate)) {
      all.lora_gate_MR = keep_or_scratch(saved, keep.lora_w13, "lora_gate_NR", u, ad->dtype());
    }
    if (ad->adapts(ExpertLinear::up)) {
      all.lora_up_MR = keep_or_scratch(saved, keep.lora_w13, "lora_up_NR", u, ad->dtype());
    }
    if (ad->adapts(ExpertLinear::down)) {
      all.lora_down_MR = keep_or_scratch(saved, keep.lora_w2, "lora_down_NR", u, ad->dtype());
    }
  }
  return all;
}

void HostExperts::forward_experts(Tensor& y_ND, ExpertRowsActs& all, const Tensor& x_ND,
                                  const std::vector<int64_t>& offset_E, const Tensor& score_N,
                                  const std::vector<uint8_t>& skip_E) {
  if (ExpertPacks::applies(*experts_)) {
    grouped_experts_forward(*experts_, y_ND, all, x_ND, offset_E, score_N, skip_E);
    return;
  }
  const bool post_norm = experts_->config().post_norm;
  for_each_expert(
      offset_E,
      [&](int64_t e) {
        const int64_t b = offset_E[size_t(e)], end = offset_E[size_t(e) + 1];
        ExpertRowsActs acts;
        acts.h_M2F = all.h_M2F.rows(b, end);
        acts.a_MF = all.a_MF.rows(b, end);
        lora_rows(acts, all, b, end);
        if (post_norm) {
          acts.ypre_MD = all.ypre_MD.rows(b, end);
          acts.rstd_M = all.rstd_M.rows(b, end);
        }
        Tensor y = y_ND.rows(b, end);
        experts_->forward_rows(e, y, acts, x_ND.rows(b, end),
                               score_N.defined() ? score_N.rows(b, end) : Tensor());
      },
      skip_E);
}

void HostExperts::forward(Tensor& y_ND, const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                          const Tensor& score_N, SavedTensors& saved, const ExpertSaves& keep) {
  check_forward(y_ND, x_ND, offset_E, score_N);
  ExpertRowsActs all = forward_buffers(saved, x_ND, keep);
  forward_experts(y_ND, all, x_ND, offset_E, score_N, {});
}

void HostExperts::replay_buffers(SavedTensors& saved, const Tensor& x_ND,
                                 const std::vector<int64_t>& offset_E, const ExpertStages& stages) {
  const ExpertsConfig& cfg = experts_->config();
  const int64_t N = offset_E.back(), D = cfg.hidden, F = cfg.ffn;
  const DType dt = experts_->dtype();
  check_rows_layout(offset_E, cfg.num_experts, N, name());
  TIERMOE_ASSERT(!stages.w2 || cfg.post_norm || adapted().w2,
                 "only a postprocess's or a down adapter's backward reads W2 products");
  // A replayed stage rebuilds every product backward reads from it, the
  // adapter's intermediates included.
  ExpertAdapter* ad = experts_->adapter();
  auto alloc_lora = [&](ExpertLinear p, const char* name) {
    if (ad && ad->adapts(p)) saved.alloc(name, {N, ad->rank()}, ad->dtype());
  };
  if (stages.w13) {
    check_shape(x_ND, {N, D}, name() + ": replay x_ND");
    saved.alloc("h_N2F", {N, 2 * F}, dt);
    alloc_lora(ExpertLinear::gate, "lora_gate_NR");
    alloc_lora(ExpertLinear::up, "lora_up_NR");
  }
  if (stages.act) saved.alloc("a_NF", {N, F}, dt);
  if (stages.w2) {
    if (cfg.post_norm) {
      saved.alloc("ypre_ND", {N, D}, dt);
      saved.alloc("rstd_N", {N}, experts_->grad_dtype());
    }
    alloc_lora(ExpertLinear::down, "lora_down_NR");
  }
}

void HostExperts::replay_experts(SavedTensors& saved, const Tensor& x_ND,
                                 const std::vector<int64_t>& offset_E, const Tensor& score_N,
                                 const ExpertStages& stages, const std::vector<uint8_t>& skip_E) {
  const ExpertsConfig& cfg = experts_->config();
  const int64_t D = cfg.hidden;
  const DType dt = experts_->dtype();
  // The same per-expert order of stages as forward_rows, over the same rows.
  for_each_expert(
      offset_E,
      [&](int64_t e) {
        const int64_t b = offset_E[size_t(e)], end = offset_E[size_t(e) + 1];
        ExpertRowsActs acts = rows_of(saved, cfg.post_norm && stages.w2, false, true, b, end);
        if (stages.w13) experts_->w13_forward_rows(e, acts, x_ND.rows(b, end));
        if (stages.act) experts_->act_forward_rows(acts.a_MF, acts.h_M2F);
        if (stages.w2) {
          // The W2 output itself is not wanted: only the postprocess's inputs
          // and the down adapter's intermediate.
          Tensor y = Tensor::empty({end - b, D}, dt, MemTag::activations, saved.tracker());
          experts_->w2_forward_rows(e, y, acts,
                                    score_N.defined() ? score_N.rows(b, end) : Tensor());
        }
      },
      skip_E);
}

void HostExperts::replay(SavedTensors& saved, const Tensor& x_ND,
                         const std::vector<int64_t>& offset_E, const Tensor& score_N,
                         const ExpertStages& stages) {
  replay_buffers(saved, x_ND, offset_E, stages);
  replay_experts(saved, x_ND, offset_E, score_N, stages, {});
}

void HostExperts::check_backward(const Tensor& dx_ND, const Tensor& dscore_N, const Tensor& dy_ND,
                                 const std::vector<int64_t>& offset_E,
                                 const Tensor& score_N) const {
  const ExpertsConfig& cfg = experts_->config();
  const int64_t N = dy_ND.size(0), D = cfg.hidden;
  check_shape(dy_ND, {N, D}, name() + ": dy_ND");
  check_shape(dx_ND, {N, D}, name() + ": dx_ND");
  check_rows_layout(offset_E, cfg.num_experts, N, name());
  if (score_N.defined()) check_shape(dscore_N, {N}, name() + ": dscore_N");
}

void HostExperts::backward_experts(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                                   const std::vector<int64_t>& offset_E, const Tensor& score_N,
                                   const SavedTensors& saved, bool weight_grads,
                                   bool adapter_grads, const std::vector<uint8_t>& skip_E) {
  const bool post_norm = experts_->config().post_norm;
  if (weight_grads) experts_->allocate_grads();
  const ExpertAdapted ad = adapted();
  if (ExpertPacks::applies(*experts_)) {
    const ExpertRowsActs all = rows_of(saved, false, weight_grads || (adapter_grads && ad.w13),
                                       adapter_grads, 0, dy_ND.size(0));
    grouped_experts_backward(*experts_, dx_ND, dscore_N, dy_ND, all, offset_E, score_N,
                             weight_grads, skip_E);
    return;
  }
  // Rows of experts that got none stay untouched by the loop; padded rows
  // inside an expert's block are computed like any other (their dy is 0).
  for_each_expert(
      offset_E,
      [&](int64_t e) {
        const int64_t b = offset_E[size_t(e)], end = offset_E[size_t(e) + 1];
        ExpertRowsActs acts = rows_of(saved, post_norm, weight_grads || (adapter_grads && ad.w13),
                                      adapter_grads, b, end);
        Tensor dx = dx_ND.rows(b, end);
        Tensor ds = score_N.defined() ? dscore_N.rows(b, end) : Tensor();
        experts_->backward_rows(e, dx, ds, dy_ND.rows(b, end), acts,
                                score_N.defined() ? score_N.rows(b, end) : Tensor(), weight_grads);
      },
      skip_E);
}

void HostExperts::backward(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                           const std::vector<int64_t>& offset_E, const Tensor& score_N,
                           const SavedTensors& saved, bool weight_grads, bool adapter_grads) {
  check_backward(dx_ND, dscore_N, dy_ND, offset_E, score_N);
  backward_experts(dx_ND, dscore_N, dy_ND, offset_E, score_N, saved, weight_grads, adapter_grads,
                   {});
}

}  // namespace tiermoe
