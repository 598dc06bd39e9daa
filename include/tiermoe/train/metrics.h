#pragma once
// Per-step training metrics: --metrics FILE gets one JSON object per line
// (JSONL), flushed each step so a crashed run keeps what it logged:
//
//   {"step": 12, "loss": 3.21, "ce": 3.21, "aux_loss": 1.02, "lr": 0.003, "grad_norm": 0.84,
//    "tokens": 1024, "tokens_per_s": 12345.6, "step_time_s": 0.083,
//    "attention_s": 0.021, "mlp_s": 0.035, "total_steps": 2000, "loss_floor": 1.69,
//    "memory_bytes": {"live": {"weights": ..., ...}, "peak": {...}}}
//
// attention_s and mlp_s are the step's wall time in the attention blocks and
// in the MoE blocks / dense MLPs (forward, backward, replays). "time_split_s"
// splits the whole step into disjoint parts (core/step_times.h): data,
// embedding, norms (with RoPE and the residual adds), projections (LoRA
// included), attention (the core), router, dispatch (and combine), experts
// (the host's), expert_wait (for the device tier), lm_head (with the loss),
// optimizer, and other: step_time_s less the parts' sum, what none covers.
// loss_floor is there when the data has one (the built-in corpus).
//
// With a device tier, "tier" holds the step's tier_step_json: its totals,
// and "layers" with each MoE layer's figures and "resident_experts" (the
// expert ids on the device after the step).
//
// More than one rank adds "comm": {"alltoall_bytes": ..., "alltoall_s": ...,
// "alltoall_calls": ..., "fold_bytes": ..., "fold_s": ...} (rank 0's).
//
// Memory is MemoryTracker::process() by tag (weights, grads, optimizer,
// activations, saved, device).
#include <array>
#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <optional>
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
// {"data": s, "embedding": s, ..., "other": step_s - their sum}.
nlohmann::json time_split_json(const StepTimes& parts, double step_s);
// This rank's collectives: the MoE layers' all-to-alls (bytes sent plus
// received, seconds, calls) and the allgathers that sum the replicated
// gradients, the losses and the norm ("fold_*").
nlohmann::json comm_stats_json(const CommStats& s);
// A run's totals for --json, with the all-to-all bytes of every rank added
// up (an allgather: every rank calls it).
nlohmann::json comm_run_json(const CommStats& run, Comm& comm, int64_t steps);

// What every line of a run repeats, so that any line (or a file cut short)
// says how far the run has come and what loss it cannot beat.
struct MetricsRunInfo {
  int64_t total_steps = 0;  // 0: not written
  std::optional<double> loss_floor;
};

class MetricsWriter {
 public:
  // Starts a new file in place of `path` (a rename: the old one is never
  // truncated), or appends to it (a resumed run continues the file).
  MetricsWriter(const std::string& path, bool append, MetricsRunInfo run = {});
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const StepStats& s, const MemorySnapshot& memory);

 private:
  std::string path_;
  MetricsRunInfo run_;
  int fd_ = -1;
};

// The median of `values` (the mean of the middle two for an even count); 0 when empty.
double median(std::vector<double> values);

}  // namespace tiermoe
