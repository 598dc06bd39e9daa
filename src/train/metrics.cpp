#include "tiermoe/train/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"

namespace tiermoe {

using detail::str_of;
using nlohmann::json;

MemorySnapshot memory_snapshot(const MemoryTracker& tracker) {
  MemorySnapshot m;
  for (size_t i = 0; i < kNumMemTags; ++i) {
    m.live[i] = tracker.live(MemTag(i));
    m.peak[i] = tracker.peak(MemTag(i));
  }
  return m;
}

json bytes_by_tag(const std::array<size_t, kNumMemTags>& bytes) {
  json j = json::object();
  for (size_t i = 0; i < kNumMemTags; ++i) j[std::string(mem_tag_name(MemTag(i)))] = bytes[i];
  return j;
}

json tier_totals_json(const TierLayerStats& t) {
  // Padding waste: zero rows the buckets added, of all rows the device ran.
  const double launched = double(t.device_rows) * 2 + double(t.padded_rows);
  return {{"hot_fraction", t.hot_fraction()},
          {"rows", t.rows},
          {"device_rows", t.device_rows},
          {"device_calls", t.device_calls},
          {"padded_rows", t.padded_rows},
          {"padding_waste", launched > 0 ? double(t.padded_rows) / launched : 0.0},
          {"bytes_up", t.bytes_up},
          {"bytes_down", t.bytes_down},
          {"host_s", t.host_s},
          {"wait_s", t.wait_s},
          {"device_s", t.device_s},
          {"transfer_s", t.transfer_s},
          {"faults", t.faults}};
}

json tier_step_json(const TierStepStats& s) {
  json j = tier_totals_json(s.total);
  j["bytes_up"] = s.total.bytes_up + s.bytes_moved + s.bytes_synced;
  j["drift"] = s.drift;
  j["resident"] = s.resident;
  j["replacements"] = s.replacements;
  j["moved_in"] = s.moved_in;
  j["moved_out"] = s.moved_out;
  j["bytes_moved"] = s.bytes_moved;
  j["move_s"] = s.move_s;
  j["bytes_synced"] = s.bytes_synced;
  j["sync_s"] = s.sync_s;
  j["predicted_step_s"] = s.predicted_step_s;
  j["faults"] = s.faults;
  json layers = json::array();
  for (size_t l = 0; l < s.layers.size(); ++l) {
    json one = tier_totals_json(s.layers[l]);
    if (l < s.resident_experts.size()) one["resident_experts"] = s.resident_experts[l];
    layers.push_back(std::move(one));
  }
  j["layers"] = std::move(layers);
  return j;
}

json time_split_json(const StepTimes& parts, double step_s) {
  json j = json::object();
  for (size_t i = 0; i < kNumStepParts; ++i)
    j[std::string(step_part_name(StepPart(i)))] = parts.s[i];
  j["other"] = step_s - parts.sum();
  return j;
}

json step_metrics_json(const StepStats& s, const MemorySnapshot& memory) {
  json j = {
      {"step", s.step},
      {"loss", s.loss},
      {"ce", s.ce},
      {"aux_loss", s.aux},
      {"lr", s.lr},
      {"grad_norm", s.grad_norm},
      {"tokens", s.tokens},
      {"tokens_per_s", s.seconds > 0 ? double(s.tokens) / s.seconds : 0.0},
      {"step_time_s", s.seconds},
      {"attention_s", s.attention_s},
      {"mlp_s", s.mlp_s},
      {"time_split_s", time_split_json(s.times, s.seconds)},
      {"memory_bytes", {{"live", bytes_by_tag(memory.live)}, {"peak", bytes_by_tag(memory.peak)}}}};
  if (s.tier) j["tier"] = tier_step_json(*s.tier);
  if (s.comm) j["comm"] = comm_stats_json(*s.comm);
  return j;
}

json comm_stats_json(const CommStats& s) {
  const CommOpStats& a = s[CommOp::alltoallv];
  const CommOpStats& g = s[CommOp::allgather];
  return {{"alltoall_bytes", a.bytes_sent + a.bytes_received},
          {"alltoall_s", a.seconds},
          {"alltoall_calls", a.calls},
          {"fold_bytes", g.bytes_sent + g.bytes_received},
          {"fold_s", g.seconds}};
}

json comm_run_json(const CommStats& run, Comm& comm, int64_t steps) {
  json j = comm_stats_json(run);
  const CommOpStats& a = run[CommOp::alltoallv];
  uint64_t all = 0;
  for (int64_t b : comm.allgather_value(int64_t(a.bytes_sent + a.bytes_received), "comm totals")) {
    all += uint64_t(b);
  }
  j["alltoall_bytes_all_ranks"] = all;
  j["alltoall_bytes_per_step"] =
      steps > 0 ? double(a.bytes_sent + a.bytes_received) / double(steps) : 0.0;
  j["alltoall_s_per_step"] = steps > 0 ? a.seconds / double(steps) : 0.0;
  j["ranks"] = comm.size();
  j["transport"] = comm.name();
  return j;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append, MetricsRunInfo run)
    : path_(path), run_(run) {
  if (!append) {
    fd_ = create_replacing(path);
    return;
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  TIERMOE_CHECK(fd_ >= 0, str_of("cannot open the metrics file: ", std::strerror(errno)), path,
                "check the path for --metrics");
}

MetricsWriter::~MetricsWriter() { ::close(fd_); }

void MetricsWriter::write(const StepStats& s, const MemorySnapshot& memory) {
  json j = step_metrics_json(s, memory);
  if (run_.total_steps > 0) j["total_steps"] = run_.total_steps;
  if (run_.loss_floor) j["loss_floor"] = *run_.loss_floor;
  const std::string line = j.dump() + "\n";
  write_all(fd_, line.data(), line.size(), path_);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t n = values.size();
  std::sort(values.begin(), values.end());
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace tiermoe
