#pragma once
// The training step: micro-batches with gradient accumulation, global-norm
// clipping, an optimizer update at the scheduled learning rate.
//
//   zero grads
//   for each of grad_accum micro-batches:  forward (B x L tokens), backward (grads +=)
//   grads /= grad_accum                    (grad_accum.h: divide once, after the sum)
//   norm = clip_grad_norm(grads, max_grad_norm)   (throws naming the first non-finite grad)
//   optimizer.step(lr(step))
//
// The reported loss of a step is the mean of its micro-batch losses, as HF's
// Trainer logs it.
//
// Data and expert parallelism (a model built over a Comm of P ranks): the
// step's grad_accum micro-batches are dealt out in passes of P, micro-batch
// i * P + r to rank r in pass i (so grad_accum must be a multiple of P), and
// every rank draws all of them from the sampler to stay at the same data
// position. Within a pass the MoE layers send rows to the experts' owners,
// which compute each source rank's rows on their own, in rank order: an
// expert's gradient adds up exactly as on one rank running the micro-batches
// one after another. Every other gradient (attention, norms, router,
// embeddings, dense MLPs, LoRA on them) is replicated: each micro-batch's is
// computed alone and the micro-batches' are added in micro-batch order
// (Comm::fold_sum), on one rank as on P. So a run gives the same bits on any
// number of ranks that divides the expert count and grad_accum.
//
// Trainable parameters: with LoRA enabled, the adapters (fp32 masters);
// otherwise every parameter that requires grad (full fine-tuning; bf16
// weights get fp32 masters through Parameter::wrap). Norm weights and
// biases are exempt from weight decay, as HF's Trainer exempts them.
//
// The whole state a resumed run needs is the model's weights, the
// optimizer's state_tensors() and TrainerState (step, data position,
// losses); restoring the three continues bitwise identically.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/model/causal_lm.h"
#include "tiermoe/train/adamw.h"
#include "tiermoe/train/data.h"
#include "tiermoe/train/lr_schedule.h"
#include "tiermoe/train/optimizer.h"
#include "tiermoe/train/sgd.h"

namespace tiermoe {

enum class OptimizerKind { adamw, sgd };
OptimizerKind parse_optimizer_kind(std::string_view s);  // "adamw" | "sgd"
std::string_view optimizer_kind_name(OptimizerKind k);

struct TrainerOptions {
  int64_t steps = 1;           // optimizer steps of the whole run (the cosine schedule spans them)
  int64_t batch = 8;           // sequences per micro-batch (B)
  int64_t seq_len = 64;        // tokens per sequence (L)
  int64_t grad_accum = 1;      // micro-batches per optimizer step
  double max_grad_norm = 1.0;  // HF's default; <= 0 disables clipping (the norm is still checked)
  OptimizerKind optimizer = OptimizerKind::adamw;
  AdamWOptions adamw;
  SgdOptions sgd;
  LrScheduleOptions schedule;  // total_steps is taken from `steps`
  bool shuffle = true;         // the sampler reshuffles windows every epoch
  uint64_t data_seed = 0;      // the sampler's shuffle seed
  int ranks = 1;               // data-parallel ranks (the Trainer sets it from the model)

  // Throws an Error naming the flag for a value out of range.
  void validate() const;
};

// One optimizer step's figures.
struct StepStats {
  int64_t step = 0;  // 1-based: the number of steps done after this one
  double loss = 0;   // mean of the micro-batch losses (what the model's forward returns)
  double ce = 0;     // mean cross-entropy
  double aux = 0;    // mean load-balancing loss (counted in `loss` only when the config says so)
  double lr = 0;     // the rate this update used
  double grad_norm = 0;  // pre-clip global norm
  int64_t tokens = 0;    // tokens this step processed, all ranks (B * L * grad_accum)
  // Whole steps' batches drawn before this step's and skipped: no row of
  // theirs held a counted target (SFT labels all -100), so they would have
  // moved the weights (AdamW's decay and momentum) with nothing learned.
  int64_t skipped_batches = 0;
  double seconds = 0;    // wall time of the step
  double attention_s = 0;  // of which in the attention blocks (forward + backward)
  double mlp_s = 0;        // in the MoE blocks and dense MLPs (the experts' share is tier->total)
  // The step's wall time part by part (core/step_times.h); with a device
  // tier, waiting for it is expert_wait and the host's experts the rest of
  // the experts' time. seconds - times.sum() is what no part covers.
  StepTimes times;
  std::optional<TierStepStats> tier;  // with a device tier: what it did this step
  // More than one rank: this rank's collectives in the step (the MoE
  // layers' all-to-alls; the gradient fold and the norm's allgathers).
  std::optional<CommStats> comm;
};

// What a checkpoint stores besides weights and optimizer state.
struct TrainerState {
  int64_t step = 0;
  SamplerPosition data;
  std::vector<double> losses;  // one per step done
};

// Thrown by Trainer::step when its stop poll asked for a stop between two
// micro-batches: the step is abandoned whole (no update, the data position
// back at its start), so the state is the last whole step's.
struct StepAbandoned {};

class Trainer {
 public:
  // `model` and `data` must outlive the trainer. Builds the optimizer over
  // the trainable parameters; throws when there are none.
  Trainer(CausalLM& model, const RowSource& data, TrainerOptions options);

  // Runs grad_accum micro-batches (forward + backward) from zeroed grads and
  // leaves the averaged gradient in the parameters; returns the mean loss
  // parts in a StepStats without lr/grad_norm. No optimizer update.
  StepStats accumulate_gradients();
  // One whole optimizer step.
  StepStats step();
  // Asked between the micro-batches of a step (one process, no device
  // tier): true abandons the step (StepAbandoned), so a stop does not wait
  // out a long --grad-accum.
  void set_stop_poll(std::function<bool()> poll) { stop_poll_ = std::move(poll); }

  int64_t steps_done() const { return step_; }
  bool finished() const { return step_ >= options_.steps; }
  const TrainerOptions& options() const { return options_; }
  const std::vector<double>& losses() const { return losses_; }

  std::vector<Parameter>& parameters() { return params_; }
  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  const LrSchedule& schedule() const { return schedule_; }

  TrainerState state() const;
  // Restores a saved run: the optimizer's state (bf16 masters included) and
  // the step, data position and losses. Checks that they fit this run.
  void restore(const TrainerState& state, const OptimizerState& optimizer_state);

 private:
  // Adds this pass's replicated gradients into the step's, in rank order.
  void fold_replicated_grads(int64_t pass, int64_t passes);
  // Moves the data position to the start of the next step whose rows hold a
  // counted target on some rank, skipping (and counting in `skipped`) whole
  // steps that hold none. It draws to look, then rewinds: the step's
  // micro-batches are drawn again one at a time as they run, so memory holds
  // one, whatever --grad-accum is.
  void skip_to_next_step(int64_t* skipped);
  // This rank's next micro-batch: every rank draws the pass's P batches and
  // keeps its own.
  TokenBatch next_micro_batch();

  CausalLM& model_;
  const RowSource& data_;
  TrainerOptions options_;
  WindowSampler sampler_;
  LrSchedule schedule_;
  std::vector<Parameter> params_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<Tensor> fold_acc_;  // per parameter: the step's replicated gradient so far
  std::function<bool()> stop_poll_;
  int64_t step_ = 0;
  std::vector<double> losses_;
};

// The parameters a Trainer updates for `model` (see the header comment).
std::vector<Parameter> trainable_parameters(CausalLM& model);

}  // namespace tiermoe
