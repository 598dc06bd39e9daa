#pragma once
// Training checkpoints: --out DIR holds DIR/checkpoint-<step>/, each written
// atomically (into a temporary sibling, every file fsynced, the directory
// renamed into place, the parent fsynced), so a crash or a NaN stop never
// leaves a half-written checkpoint under a real name.
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
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

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
// file in it, then renames it to `dir` (an existing `dir` is replaced) and
// fsyncs the parent. On an exception the temporary directory is removed and
// `dir` is untouched.
void write_dir_atomically(const std::string& dir,
                          const std::function<void(const std::string&)>& write);

// `path` itself when it holds trainer_state.json; otherwise the
// checkpoint-<N> under it with the largest N. Error when there is none.
std::string resolve_checkpoint(const std::string& path);
// True when `dir` holds at least one checkpoint-<N> directory.
bool has_checkpoints(const std::string& dir);

// Writes DIR/checkpoint-<step> for the trainer's current step.
std::string save_train_checkpoint(const std::string& out_dir, const CausalLM& model,
                                  const Trainer& trainer, const TrainConfig& config);

// A checkpoint read back. The model weights are read by resume_model.
struct TrainCheckpoint {
  std::string dir;
  TrainConfig config;
  TrainerState state;
  OptimizerState optimizer;
  std::optional<RoutingProfile> profile;  // written by runs with a device tier
};
TrainCheckpoint read_train_checkpoint(const std::string& dir);
// Only the run config recorded in a checkpoint (cheap: no tensors).
TrainConfig read_checkpoint_config(const std::string& dir);

// The model of a checkpoint: full fine-tuning loads its weights; LoRA builds
// the base model from the config and loads the checkpoint's adapter.
CausalLM resume_model(const TrainCheckpoint& ckpt);

// Exports the end of a run: the PEFT adapter (LoRA) or the full model, into
// `dir`, atomically.
void export_final(const std::string& dir, const CausalLM& model, const TrainConfig& config);

}  // namespace tiermoe
