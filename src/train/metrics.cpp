#include "tiermoe/train/metrics.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "tiermoe/core/error.h"

namespace tiermoe {

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

json step_metrics_json(const StepStats& s, const MemorySnapshot& memory) {
  return {
      {"step", s.step},
      {"loss", s.loss},
      {"ce", s.ce},
      {"aux_loss", s.aux},
      {"lr", s.lr},
      {"grad_norm", s.grad_norm},
      {"tokens", s.tokens},
      {"tokens_per_s", s.seconds > 0 ? double(s.tokens) / s.seconds : 0.0},
      {"step_time_s", s.seconds},
      {"memory_bytes", {{"live", bytes_by_tag(memory.live)}, {"peak", bytes_by_tag(memory.peak)}}}};
}

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  TIERMOE_CHECK(out_.good(), "cannot open the metrics file", path, "check the path for --metrics");
}

void MetricsWriter::write(const StepStats& s, const MemorySnapshot& memory) {
  out_ << step_metrics_json(s, memory).dump() << "\n";
  out_.flush();
  TIERMOE_CHECK(out_.good(), "cannot write the metrics file", path_, "check free disk space");
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const size_t n = values.size();
  std::sort(values.begin(), values.end());
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace tiermoe
