#pragma once
// A whole training run as `tiermoe train` runs it: build (or resume) the
// model, data and trainer, validate everything before the first step, then
// step, logging progress and metrics and writing checkpoints, and export the
// result at the end.
//
// Every bad input (a checkpoint that disagrees with its config, data shorter
// than one window, a token outside the vocabulary, an unknown remat region,
// --out already holding checkpoints of another run, or locked by a run
// still going: out_dir.h) is an Error before any step. A non-finite loss or
// gradient stops the run with the model's or grad-clip's Error, a diverged
// one with the DivergenceGuard's, and a checkpoint of non-finite weights or
// optimizer state is refused; the checkpoints already written stay as they
// were. Leftovers of killed runs in out_dir are cleaned up at the start.
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tiermoe/core/memory.h"
#include "tiermoe/dist/comm.h"
#include "tiermoe/train/divergence.h"
#include "tiermoe/train/trainer_config.h"

namespace tiermoe {

struct RunControl {
  // Expert and data parallelism over the Comm's ranks (null or one rank:
  // none). Every rank runs run_training with the same config; only rank 0
  // logs, prints progress and writes --metrics (give `log` to rank 0 alone).
  Comm* comm = nullptr;
  std::string out_dir{};        // checkpoints and the final export; empty: nothing written
  int64_t save_every = 0;       // a checkpoint every N steps (0: only at the end)
  int64_t stop_after = 0;       // stop once this many steps are done (0: run all steps)
  int64_t keep_last = 0;        // checkpoints kept in out_dir, the newest (0: every one)
  std::string resume{};         // a checkpoint directory (already resolved)
  std::string metrics_file{};   // JSONL per step; empty: none
  std::ostream* log = nullptr;  // progress and messages; null: silent
  bool progress_tty = false;
  int64_t progress_every = 0;
  // Called before each step with its number (1-based); the CLI's fault
  // injection for the tests of a failing rank. Empty: nothing.
  std::function<void(int64_t)> before_step{};
  // Called after each checkpoint is written (rank 0 only), with its
  // directory; the metrics file holds every step up to it. The CLI's
  // train --report refreshes the report here. Empty: nothing.
  std::function<void(const std::string&)> after_checkpoint{};
  // Polled before each step: non-zero (a signal's number) ends the run there,
  // as a run that reached its last step ends (its checkpoint saved), with
  // TrainSummary::stopped_by set. Over several ranks the run stops once any
  // rank asks, at the same step on all. Empty: never.
  std::function<int()> stop_requested{};
  DivergenceOptions divergence{};  // when a finite run counts as diverged (divergence.h)
  // The memory plan (train/memory_plan.h) is logged before loading; a run
  // whose plan exceeds this many bytes is refused then, with what would make
  // it fit. 0: what the machine has available (MemAvailable).
  uint64_t max_memory = 0;
};

struct TrainSummary {
  int64_t steps = 0;           // steps done (the whole run's, a resumed part included)
  std::vector<double> losses;  // one per step done
  double final_loss = 0;
  double tokens_per_s = 0;  // over this process's steps
  double step_time_s = 0;   // median over this process's steps
  double seconds = 0;       // this process's training time
  std::array<size_t, kNumMemTags> memory_peak{};  // measured, over the steps
  nlohmann::json memory_plan;  // the plan's prediction beside memory_peak, per tag
  std::optional<double> loss_floor;       // built-in corpus: its entropy rate
  std::optional<double> unigram_entropy;  // built-in corpus: the context-free loss
  std::string last_checkpoint;            // empty when none was written
  std::string final_export;               // DIR/final or DIR/adapter; empty when not written
  nlohmann::json tier;                    // the device tier's totals; null without one
  nlohmann::json comm;                    // more than one rank: the collectives' totals
  // The mean step's split (metrics.h "time_split_s") over this process's
  // steps, and that mean step's seconds ("step_s"), which the parts add to.
  nlohmann::json time_split;
  int64_t skipped_batches = 0;  // batches without a counted target, skipped (StepStats)
  int stopped_by = 0;  // what RunControl::stop_requested returned; 0: ran to the end

  nlohmann::json to_json() const;
};

// With control.resume set, `config` must equal the checkpoint's recorded config.
TrainSummary run_training(const TrainConfig& config, const RunControl& control);

}  // namespace tiermoe
