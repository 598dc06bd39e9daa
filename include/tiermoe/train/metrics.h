#pragma once
// Per-step training metrics: --metrics FILE gets one JSON object per line
// (JSONL), flushed each step so a crashed run keeps what it logged:
//
//   {"step": 12, "loss": 3.21, "ce": 3.21, "aux_loss": 1.02, "lr": 0.003, "grad_norm": 0.84,
//    "tokens": 1024, "tokens_per_s": 12345.6, "step_time_s": 0.083,
//    "memory_bytes": {"live": {"weights": ..., ...}, "peak": {...}}}
//
// More than one rank adds "comm": {"alltoall_bytes": ..., "alltoall_s": ...,
// "alltoall_calls": ..., "fold_bytes": ..., "fold_s": ...} (rank 0's).
//
// Memory is MemoryTracker::process() by tag (weights, grads, optimizer,
// activations, saved, device).
#include <array>
#include <cstddef>
#include <fstream>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tiermoe/core/memory.h"
#include "tiermoe/train/trainer.h"

namespace tiermoe {

struct MemorySnapshot {
  std::array<size_t, kNumMemTags> live{};
  std::array<size_t, kNumMemTags> peak{};
};
MemorySnapshot memory_snapshot(const MemoryTracker& tracker = MemoryTracker::process());
// {"weights": bytes, ...} for every tag.
nlohmann::json bytes_by_tag(const std::array<size_t, kNumMemTags>& bytes);

// One step's metrics line (without the trailing newline).
// The device tier's figures: one layer's (or a sum's) and one step's, with
// its per-layer list (the contract's keys: hot_fraction, device_calls, bytes_up,
// bytes_down, replacements, ...). Padding waste counts forward and backward.
nlohmann::json tier_totals_json(const TierLayerStats& t);
nlohmann::json tier_step_json(const TierStepStats& s);
nlohmann::json step_metrics_json(const StepStats& s, const MemorySnapshot& memory);
// This rank's collectives: the MoE layers' all-to-alls (bytes sent plus
// received, seconds, calls) and the allgathers that sum the replicated
// gradients, the losses and the norm ("fold_*").
nlohmann::json comm_stats_json(const CommStats& s);
// A run's totals for --json, with the all-to-all bytes of every rank added
// up (an allgather: every rank calls it).
nlohmann::json comm_run_json(const CommStats& run, Comm& comm, int64_t steps);

class MetricsWriter {
 public:
  // Truncates `path`, or appends to it (a resumed run continues the file).
  MetricsWriter(const std::string& path, bool append);
  void write(const StepStats& s, const MemorySnapshot& memory);

 private:
  std::string path_;
  std::ofstream out_;
};

// The median of `values` (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> values);

}  // namespace tiermoe
