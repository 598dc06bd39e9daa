#include "tiermoe/train/trainer.h"

#include <chrono>
#include <cmath>

#include "tiermoe/core/error.h"
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
  TIERMOE_CHECK(adamw.weight_decay >= 0 && sgd.weight_decay >= 0, "weight decay must be >= 0",
                "--weight-decay", "");
  TIERMOE_CHECK(adamw.beta1 >= 0 && adamw.beta1 < 1 && adamw.beta2 >= 0 && adamw.beta2 < 1,
                str_of("AdamW betas (", adamw.beta1, ", ", adamw.beta2, ") must lie in [0, 1)"),
                "--adam-beta1/--adam-beta2", "HF's defaults are 0.9 and 0.999");
  TIERMOE_CHECK(adamw.eps > 0, "--adam-eps must be positive", "--adam-eps", "HF's default is 1e-8");
  LrScheduleOptions s = schedule;
  s.total_steps = steps;
  LrSchedule check(s);  // throws on a bad warmup or min-lr ratio
}

std::vector<Parameter> trainable_parameters(CausalLM& model) {
  std::vector<Parameter> out;
  for (ModelParam& p : model.has_lora() ? model.lora_params() : model.params()) {
    if (!p.requires_grad) continue;
    Parameter param = Parameter::wrap(p.name, p.value, p.grad);
    param.weight_decay = p.role != HfRole::norm && p.role != HfRole::bias;
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
      options_((options.validate(), options)),
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
  zero_grads(params_);
  StepStats s;
  const int64_t B = options_.batch, L = options_.seq_len;
  for (int64_t micro = 0; micro < options_.grad_accum; ++micro) {
    TokenBatch batch = sampler_.next_batch(B);
    const double loss =
        model_.forward(batch.inputs_BL, batch.targets_BL, B, L, /*grad=*/true, batch.layout);
    // The model names the first non-finite layer output; this catches what
    // slips past it (e.g. an infinite logit cancelling in the loss).
    TIERMOE_CHECK(std::isfinite(loss), str_of("the loss is ", loss, " at step ", step_ + 1),
                  "trainer", "lower --lr or check the data and the checkpoint");
    model_.backward();
    s.loss += loss;
    s.ce += model_.last_loss().ce;
    s.aux += model_.last_loss().aux;
    s.tokens += B * L;
  }
  const double n = double(options_.grad_accum);
  s.loss /= n;
  s.ce /= n;
  s.aux /= n;
  if (options_.grad_accum > 1) average_accumulated_grads(params_, options_.grad_accum);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

StepStats Trainer::step() {
  TIERMOE_CHECK(!finished(), str_of("the run has done all its ", options_.steps, " steps"),
                "trainer", "raise --steps to train further");
  const auto start = std::chrono::steady_clock::now();
  DeviceTier* tier = model_.device_tier();
  if (tier) tier->begin_step();
  StepStats s = accumulate_gradients();
  s.grad_norm = options_.max_grad_norm > 0 ? clip_grad_norm(params_, options_.max_grad_norm)
                                           : global_grad_norm(params_);
  s.lr = schedule_.lr(step_);
  optimizer_->step(s.lr);
  // Between steps: updated expert weights go back to the device, the
  // routing profile advances and the placement may change.
  if (tier) s.tier = tier->end_step(/*weights_changed=*/true);
  ++step_;
  s.step = step_;
  losses_.push_back(s.loss);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
