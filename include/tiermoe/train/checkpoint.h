#pragma once
// Training checkpoints: --out DIR holds DIR/checkpoint-<step>/, each written
// atomically (into a temporary sibling, every file fsynced, the directory
// swapped into place in one rename, the parent fsynced), so a crash or a NaN
// stop never leaves a half-written checkpoint under a real name, and a
// replaced directory (final/, adapter/) is complete at every instant.
// A checkpoint of a non-finite state (a NaN or Inf in a trainable weight,
// an fp32 master or the optimizer state) is refused before anything is
// written. What killed runs leave behind is cleaned up by the next run
// (out_dir.h).
//
// A checkpoint directory holds
//   config.json + model weights       full fine-tuning: the whole model in its compute dtype
//                                     (bf16 runs: the working copies; masters are below)
//   adapter_config.json + adapter_model.safetensors
//                                     LoRA: the PEFT adapter only (the base model is
//                                     named in trainer_state.json)
//   optimizer.safetensors             Optimizer::state_tensors()
//   trainer_state.json                step, data position, seed, LR schedule, the run's
//                                     config, losses so far
//
// Expert parallelism (P ranks): the checkpoint is still one directory,
// written by all ranks together into one temporary directory that rank 0
// renames into place once every rank has written its part (a rank that fails
// makes every rank throw, and nothing is renamed). Rank r writes its
// experts' weights (rank 0 everything else too) as shards of one Hugging
// Face sharded checkpoint (model-0000i-of-0000n.safetensors + index), and
// its optimizer state as optimizer-0000<r+1>-of-0000P.safetensors (only
// rank 0 writes the replicated parameters' state). LoRA adapters are
// gathered and written once, by rank 0, as is trainer_state.json and the
// routing profile (the ranks' experts' profiles side by side). Any rank
// count that divides the expert count resumes it (one rank included): each
// rank reads its experts' tensors through the index and the optimizer files.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tiermoe/dist/comm.h"
#include "tiermoe/model/causal_lm.h"
#include "tiermoe/train/optimizer.h"
#include "tiermoe/train/trainer.h"
#include "tiermoe/train/trainer_config.h"

namespace tiermoe {

inline constexpr const char* kTrainerStateFile = "trainer_state.json";
inline constexpr const char* kOptimizerStateFile = "optimizer.safetensors";
inline constexpr const char* kRoutingProfileFile = "routing_profile.json";

std::string checkpoint_dir_name(int64_t step);  // "checkpoint-<step>"

// Runs `write(tmp)` on a fresh temporary directory beside `dir`, fsyncs every
// file in it, then renames it to `dir` (an existing `dir` is exchanged with
// it in one step, then removed) and fsyncs the parent. On an exception the
// temporary directory is removed and `dir` is untouched. With a Comm of P > 1 ranks every rank calls it and
// writes its part into the same temporary directory; rank 0 renames it once
// all have written, and a failure on any rank throws on every rank.
void write_dir_atomically(const std::string& dir,
                          const std::function<void(const std::string&)>& write,
                          Comm* comm = nullptr);

// `path` itself when it holds trainer_state.json; otherwise the
// checkpoint-<N> under it with the largest N. Error when there is none.
std::string resolve_checkpoint(const std::string& path);
// The checkpoint-<N> directories under `dir` as (N, path), by N.
std::vector<std::pair<int64_t, std::string>> list_checkpoint_dirs(const std::string& dir);
// True when `dir` holds at least one checkpoint-<N> directory.
bool has_checkpoints(const std::string& dir);

// Writes DIR/checkpoint-<step> for the trainer's current step; an Error
// naming the first non-finite tensor (and its rank) instead, on every rank,
// when the state is not finite.
std::string save_train_checkpoint(const std::string& out_dir, const CausalLM& model,
                                  const Trainer& trainer, const TrainConfig& config);

// A checkpoint read back. The model weights are read by resume_model.
struct TrainCheckpoint {
  std::string dir;
  TrainConfig config;
  TrainerState state;
  OptimizerState optimizer;  // every rank's parts (restore_optimizer_state picks a rank's)
  std::optional<RoutingProfile> profile;  // written by runs with a device tier; all experts
};
TrainCheckpoint read_train_checkpoint(const std::string& dir);
// Only the run config recorded in a checkpoint (cheap: no tensors).
TrainConfig read_checkpoint_config(const std::string& dir);

// The model of a checkpoint: full fine-tuning loads its weights; LoRA builds
// the base model from the config and loads the checkpoint's adapter. With a
// Comm of P ranks, this rank's part of it.
CausalLM resume_model(const TrainCheckpoint& ckpt, Comm* comm = nullptr, ProgressSink progress = {});
// The optimizer state of the parameters `model` holds: other ranks' experts'
// entries are dropped (the optimizer then checks the rest strictly).
OptimizerState optimizer_state_for(const OptimizerState& all, const CausalLM& model);
// The routing profile of `model`'s experts (a slice under expert parallelism);
// `source` (its file) names it in errors.
RoutingProfile profile_for(const RoutingProfile& all, const CausalLM& model,
                           const std::string& source);

// Exports the end of a run: the PEFT adapter (LoRA) or the full model, into
// `dir`, atomically.
void export_final(const std::string& dir, const CausalLM& model, const TrainConfig& config);

}  // namespace tiermoe
