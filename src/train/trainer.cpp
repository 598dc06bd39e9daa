#include "tiermoe/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "tiermoe/core/error.h"
#include "tiermoe/model/lm_head.h"
#include "tiermoe/train/grad_accum.h"
#include "tiermoe/train/grad_clip.h"

namespace tiermoe {

using detail::str_of;

OptimizerKind parse_optimizer_kind(std::string_view s) {
  if (s == "adamw") return OptimizerKind::adamw;
  if (s == "sgd") return OptimizerKind::sgd;
  throw Error(str_of("unknown optimizer '", s, "'"), "--optimizer", "use adamw or sgd");
}

std::string_view optimizer_kind_name(OptimizerKind k) {
  return k == OptimizerKind::adamw ? "adamw" : "sgd";
}

void TrainerOptions::validate() const {
  TIERMOE_CHECK(steps >= 1, str_of("--steps ", steps, " must be >= 1"), "--steps", "");
  TIERMOE_CHECK(batch >= 1, str_of("--batch ", batch, " must be >= 1"), "--batch", "");
  TIERMOE_CHECK(seq_len >= 1, str_of("--seq-len ", seq_len, " must be >= 1"), "--seq-len", "");
  TIERMOE_CHECK(grad_accum >= 1, str_of("--grad-accum ", grad_accum, " must be >= 1"),
                "--grad-accum", "1 means no accumulation");
  TIERMOE_CHECK(std::isfinite(max_grad_norm), "--max-grad-norm must be finite", "--max-grad-norm",
                "pass 0 to disable clipping");
  TIERMOE_CHECK(std::isfinite(schedule.base_lr) && schedule.base_lr > 0,
                str_of("--lr ", schedule.base_lr, " must be positive"), "--lr", "");
  TIERMOE_CHECK(std::isfinite(adamw.weight_decay) && adamw.weight_decay >= 0 &&
                    std::isfinite(sgd.weight_decay) && sgd.weight_decay >= 0,
                "weight decay must be finite and >= 0", "--weight-decay",
                "HF's default is 0; 0.01 to 0.1 is usual");
  TIERMOE_CHECK(adamw.beta1 >= 0 && adamw.beta1 < 1 && adamw.beta2 >= 0 && adamw.beta2 < 1,
                str_of("AdamW betas (", adamw.beta1, ", ", adamw.beta2, ") must lie in [0, 1)"),
                "--adam-beta1/--adam-beta2", "HF's defaults are 0.9 and 0.999");
  TIERMOE_CHECK(std::isfinite(adamw.eps) && adamw.eps > 0, "--adam-eps must be positive and finite",
                "--adam-eps", "HF's default is 1e-8");
  TIERMOE_CHECK(std::isfinite(sgd.momentum) && sgd.momentum >= 0 && sgd.momentum < 1,
                str_of("--momentum ", sgd.momentum, " must lie in [0, 1)"), "--momentum",
                "0.9 is usual");
  TIERMOE_CHECK(ranks >= 1 && grad_accum % ranks == 0,
                str_of("--grad-accum ", grad_accum, " is not a multiple of the ", ranks, " ranks"),
                "--grad-accum",
                str_of("each rank runs grad_accum / ranks micro-batches a step; pass --grad-accum ",
                       ranks * ((grad_accum + ranks - 1) / ranks)));
  LrScheduleOptions s = schedule;
  s.total_steps = steps;
  LrSchedule check(s);  // throws on a bad warmup or min-lr ratio
}

std::vector<Parameter> trainable_parameters(CausalLM& model) {
  std::vector<Parameter> out;
  for (ModelParam& p : model.has_lora() ? model.lora_params() : model.params()) {
    if (!p.requires_grad) continue;
    Parameter param = Parameter::wrap(p.name, p.value, p.grad);
    param.weight_decay = p.role != HfRole::norm && p.role != HfRole::bias &&
                         p.role != HfRole::gated_norm && p.role != HfRole::decay;
    param.expert = p.expert;
    out.push_back(std::move(param));
  }
  return out;
}

namespace {

LrScheduleOptions schedule_for(const TrainerOptions& o) {
  LrScheduleOptions s = o.schedule;
  s.total_steps = o.steps;
  return s;
}

SamplerOptions sampler_for(const TrainerOptions& o) {
  return SamplerOptions{.seq_len = o.seq_len, .shuffle = o.shuffle, .seed = o.data_seed};
}

}  // namespace

Trainer::Trainer(CausalLM& model, const RowSource& data, TrainerOptions options)
    : model_(model),
      data_(data),
      options_((options.ranks = model.ep_ranks(), options.validate(), options)),
      sampler_(data, sampler_for(options_)),
      schedule_(schedule_for(options_)),
      params_(trainable_parameters(model)) {
  TIERMOE_CHECK(!params_.empty(), "the model has no trainable parameter", "trainer",
                "pass --full, or --lora-rank to attach adapters");
  if (options_.optimizer == OptimizerKind::adamw) {
    optimizer_ = std::make_unique<AdamW>(params_, options_.adamw);
  } else {
    optimizer_ = std::make_unique<Sgd>(params_, options_.sgd);
  }
}

StepStats Trainer::accumulate_gradients() {
  const auto start = std::chrono::steady_clock::now();
  StepTimes* times = &model_.step_times();
  timed(times, StepPart::optimizer, [&] { zero_grads(params_); });
  StepStats s;
  const int64_t B = options_.batch, L = options_.seq_len;
  Comm* comm = model_.comm();
  const int P = model_.ep_ranks();
  const int64_t passes = options_.grad_accum / P;
  timed(times, StepPart::data, [&] { skip_to_next_step(&s.skipped_batches); });
  const SamplerPosition step_start = sampler_.position();
  // A stop asked for mid-step abandons it (one process without a device
  // tier: nothing else has seen the step yet).
  const bool pollable = stop_poll_ && P == 1 && model_.device_tier() == nullptr;
  for (int64_t pass = 0; pass < passes; ++pass) {
    if (pass > 0 && pollable && stop_poll_()) {
      sampler_.set_position(step_start);
      zero_grads(params_);
      throw StepAbandoned{};
    }
    // Rows padded past their last real token run without that tail: the
    // loss and gradients are the same (data.h), the attention over it is not
    // paid. Every rank cuts the same micro-batch alike, as one process would.
    TokenBatch batch;
    timed(times, StepPart::data, [&] { batch = without_padded_tail(next_micro_batch()); });
    if (pass > 0) {
      // The replicated gradients are this micro-batch's alone (folded below).
      TimedPart part(times, StepPart::optimizer);
      for (Parameter& p : params_) {
        if (p.expert < 0) p.grad.zero();
      }
    }
    const double loss = model_.forward(batch.inputs_BL, batch.targets_BL, B, batch.seq_len,
                                       /*grad=*/true, batch.layout);
    // The model names the first non-finite layer output; this catches what
    // slips past it (e.g. an infinite logit cancelling in the loss).
    TIERMOE_CHECK(std::isfinite(loss), str_of("the loss is ", loss, " at step ", step_ + 1),
                  "trainer", "lower --lr or check the data and the checkpoint");
    model_.backward();
    // The micro-batches' losses in micro-batch order, as one rank adds them.
    const double mine[3] = {loss, model_.last_loss().ce, model_.last_loss().aux};
    std::vector<double> all(size_t(3 * P));
    if (comm && P > 1) {
      comm->allgather(mine, sizeof mine, all.data(), "micro-batch losses");
    } else {
      std::copy(mine, mine + 3, all.begin());
    }
    for (int r = 0; r < P; ++r) {
      s.loss += all[size_t(3 * r)];
      s.ce += all[size_t(3 * r + 1)];
      s.aux += all[size_t(3 * r + 2)];
      s.tokens += B * L;
    }
    timed(times, StepPart::optimizer, [&] { fold_replicated_grads(pass, passes); });
  }
  const double n = double(options_.grad_accum);
  s.loss /= n;
  s.ce /= n;
  s.aux /= n;
  if (options_.grad_accum > 1) {
    timed(times, StepPart::optimizer,
          [&] { average_accumulated_grads(params_, options_.grad_accum); });
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

void Trainer::skip_to_next_step(int64_t* skipped) {
  const int P = model_.ep_ranks();
  const int64_t passes = options_.grad_accum / P;
  // Every rank looks at every micro-batch of the step, so all see the same
  // and skip together. The data holds a target somewhere (SftData checks),
  // so two epochs' worth of draws find one.
  const int64_t rows_per_step = options_.batch * options_.grad_accum;
  const int64_t max_skips = 2 * (sampler_.num_windows() / rows_per_step + 1);
  for (;;) {
    const SamplerPosition start = sampler_.position();
    bool found = false;
    for (int64_t b = 0; b < passes * P && !found; ++b) {
      found = count_targets(sampler_.next_batch(options_.batch).targets_BL) > 0;
    }
    if (found) {
      sampler_.set_position(start);
      return;
    }
    // None: every batch of it was drawn, so the position is past the step.
    ++*skipped;
    TIERMOE_CHECK(*skipped <= max_skips,
                  str_of(*skipped, " batches in a row held no counted target"), data_.source(),
                  "the data's labels are nearly all -100; give more examples a counted token");
  }
}

TokenBatch Trainer::next_micro_batch() {
  Comm* comm = model_.comm();
  const int P = model_.ep_ranks(), me = comm ? comm->rank() : 0;
  TokenBatch mine;
  for (int r = 0; r < P; ++r) {
    TokenBatch b = sampler_.next_batch(options_.batch);
    if (r == me) mine = std::move(b);
  }
  return mine;
}

void Trainer::fold_replicated_grads(int64_t pass, int64_t passes) {
  Comm* comm = model_.comm();
  const int P = model_.ep_ranks();
  if (P == 1 && passes == 1) return;  // one micro-batch: its gradient is the step's
  if (passes > 1 && fold_acc_.empty()) {
    for (const Parameter& p : params_) {
      fold_acc_.push_back(
          p.expert < 0 ? Tensor::empty(p.grad.shape(), p.grad.dtype(), MemTag::grads) : Tensor());
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    if (p.expert >= 0) continue;  // an expert's gradient is whole on its owner
    // One pass: the sum goes straight into the gradient (fold_sum gathers
    // each chunk before it writes it back).
    Tensor& acc = passes > 1 ? fold_acc_[i] : p.grad;
    if (comm) {
      comm->fold_sum(acc, p.grad, /*accumulate=*/pass > 0, p.name);
    } else {
      LocalComm local;
      local.fold_sum(acc, p.grad, /*accumulate=*/pass > 0, p.name);
    }
    if (passes > 1 && pass == passes - 1) p.grad.copy_from(acc);
  }
}

StepStats Trainer::step() {
  TIERMOE_CHECK(!finished(), str_of("the run has done all its ", options_.steps, " steps"),
                "trainer", "raise --steps to train further");
  const auto start = std::chrono::steady_clock::now();
  const CommStats comm_before = model_.comm() ? model_.comm()->stats() : CommStats();
  const LayerTimes times_before = model_.layer_times();
  const StepTimes parts_before = model_.step_times();
  DeviceTier* tier = model_.device_tier();
  if (tier) tier->begin_step();
  StepStats s = accumulate_gradients();
  Comm* comm = model_.comm();
  std::optional<TimedPart> part(std::in_place, &model_.step_times(), StepPart::optimizer);
  s.grad_norm = options_.max_grad_norm > 0 ? clip_grad_norm(params_, options_.max_grad_norm, comm)
                                           : global_grad_norm(params_, comm);
  s.lr = schedule_.lr(step_);
  optimizer_->step(s.lr);
  model_.expert_weights_changed();
  // Between steps: updated expert weights go back to the device, the
  // routing profile advances and the placement may change.
  if (tier) s.tier = tier->end_step(/*weights_changed=*/true);
  part.reset();
  if (model_.ep_ranks() > 1) s.comm = model_.comm()->stats().since(comm_before);
  ++step_;
  s.step = step_;
  losses_.push_back(s.loss);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const LayerTimes times_after = model_.layer_times();
  s.attention_s = times_after.attention_s - times_before.attention_s;
  s.mlp_s = times_after.mlp_s - times_before.mlp_s;
  s.times = model_.step_times().since(parts_before);
  if (s.tier) {
    // The experts' calls include the wait for the device tier.
    const double wait = std::min(s.tier->total.wait_s, s.times[StepPart::experts]);
    s.times[StepPart::expert_wait] = wait;
    s.times[StepPart::experts] -= wait;
  }
  return s;
}

TrainerState Trainer::state() const { return {step_, sampler_.position(), losses_}; }

void Trainer::restore(const TrainerState& state, const OptimizerState& optimizer_state) {
  TIERMOE_CHECK(
      state.step >= 0 && state.step <= options_.steps,
      str_of("the checkpoint is at step ", state.step, ", outside this run's 0..", options_.steps),
      "trainer_state.json", "resume with the --steps the run was started with");
  TIERMOE_CHECK(
      int64_t(state.losses.size()) == state.step,
      str_of("the checkpoint holds ", state.losses.size(), " losses for ", state.step, " steps"),
      "trainer_state.json", "the checkpoint is corrupt");
  sampler_.set_position(state.data);
  optimizer_->load_state(optimizer_state);
  step_ = state.step;
  losses_ = state.losses;
}

}  // namespace tiermoe
