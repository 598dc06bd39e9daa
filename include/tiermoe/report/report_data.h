#pragma once
// The report's data layer: what `tiermoe report` draws, read from the files
// a run leaves (train --metrics JSONL, a routing profile, tiermoe plan
// --json) into plain series. The HTML writer (report/html_report.h) only
// draws these; the tests hold that every series equals the metrics it was
// read from.
//
// Reading is strict where a run's own files are concerned: a line that is
// not a JSON object, or lacks "step", "loss" or "step_time_s", is an Error
// naming the file and line. Fields added later (attention_s, tier, memory,
// loss_floor, eval_loss) are optional: a series is empty when no line has
// it, and a step without it reads as 0 in series that have it elsewhere.
//
// A resumed run appends to its metrics file; when it resumed from a
// checkpoint older than the last line, steps repeat. A line whose step is at
// or below an earlier one drops the earlier lines from that step on, so the
// series hold the run as it went on (each step once, increasing).
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tiermoe/core/step_times.h"

namespace tiermoe {

// Parts of the step's wall time, each a series over RunSeries::step (s).
// They add up to step_time_s: other = step - attention - mlp - tier moves,
// and with a device tier mlp splits into host experts, waiting for the
// device, and the rest (routing, dispatch, combine, dense MLPs). The device
// runs beside the host, so device_s and transfer_s are not parts of it.
struct StepTimeSplit {
  std::vector<double> attention_s, mlp_other_s, host_experts_s, wait_s, tier_moves_s, other_s;
  std::vector<double> device_s, transfer_s;  // device stream busy; of which transfers
  // The whole step's disjoint parts, when lines carry "time_split_s"
  // (metrics.h): one series per StepPart in its order, then what no part
  // covers.
  std::array<std::vector<double>, kNumStepParts + 1> parts;
};

struct RunSeries {
  std::string source;        // the metrics file
  std::vector<double> step;  // the x of every per-step series, increasing
  std::vector<double> loss, lr, grad_norm, tokens_per_s, step_time_s;
  std::optional<double> loss_floor;          // the last line's, when lines carry one
  int64_t total_steps = 0;                   // the run's planned steps (0: not in the metrics)
  std::vector<double> eval_step, eval_loss;  // lines with "eval_loss"
  bool has_time_split = false;               // lines carry attention_s / mlp_s
  bool has_parts = false;                    // lines carry time_split_s
  StepTimeSplit time;
  bool has_tier = false;
  std::vector<double> hot_fraction, drift;
  std::vector<double> replacement_steps;  // steps whose tier made a re-placement
  // The device-resident expert ids per MoE layer after the last step (tier runs).
  std::vector<std::vector<int64_t>> resident_last;
  // Live bytes by memory tag ("weights", ...; tags in the metrics' order).
  std::vector<std::string> memory_tags;
  std::map<std::string, std::vector<double>> memory_live;
};

// A layer x expert map of routing load (average rows per step) with the
// device-resident experts marked.
struct LoadMap {
  std::string title, source;
  int64_t layers = 0, experts = 0;
  std::vector<std::vector<double>> rows_LE;       // [layer][expert]
  std::vector<std::vector<uint8_t>> resident_LE;  // [layer][expert], 1 = on the device
};

// What `tiermoe plan --json` predicted.
struct PlanSeries {
  std::string source;
  double hot_fraction = 0, step_s = 0, all_host_step_s = 0;
  double bytes = 0, budget_bytes = 0;  // device memory of the placement; the budget
  std::optional<LoadMap> load;         // when the plan carries its profile's rows
};

RunSeries read_metrics(const std::string& path);
// The same from text (`where` names it in errors); read_metrics reads the file.
RunSeries parse_metrics(const std::string& text, const std::string& where);

// A routing profile file (tier/routing_profile.h) as a load map, with
// `resident` (ids per layer; may be empty or shorter: nothing resident).
LoadMap load_map_from_profile(const std::string& profile_path,
                              const std::vector<std::vector<int64_t>>& resident);

PlanSeries read_plan(const std::string& path);
PlanSeries parse_plan(const std::string& text, const std::string& where);

// Where a run directory keeps what the report reads: DIR/metrics.jsonl, and
// the latest checkpoint's routing profile (empty when there is none).
std::string run_dir_metrics(const std::string& dir);
std::string run_dir_profile(const std::string& dir);

}  // namespace tiermoe
