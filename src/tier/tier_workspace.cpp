#include "tiermoe/tier/tiered_experts.h"

namespace tiermoe {

int64_t bucket_for(const std::vector<int64_t>& buckets, int64_t rows) {
  for (int64_t g : buckets) {
    if (g >= rows) return g;
  }
  TIERMOE_ASSERT(false, "no bucket holds ", rows, " rows");
  return 0;
}

TierWorkspace::TierWorkspace(Device& device, const ExpertShape& shape, int64_t max_rows)
    : device_(&device),
      max_rows_(max_rows),
      layout_(workspace_layout(shape, max_rows)),
      has_decode_slots_(shape.quant.has_value()) {
  buffer_ = device.alloc(size_t(kWorkspaceSets) * layout_.bytes, BufferUsage::workspace,
                         "tier workspace (bucket staging)");
}

TierWorkspace::~TierWorkspace() {
  if (buffer_.valid()) device_->free(buffer_);
}

DeviceTensor TierWorkspace::slot(std::string_view name, int64_t G, int64_t set) const {
  TIERMOE_ASSERT(G >= 1 && G <= max_rows_, "bucket ", G, " past the workspace's ", max_rows_);
  DeviceTensor t = in_set(name, set);
  t.shape[0] = G;
  return t;
}

DeviceTensor TierWorkspace::decoded(std::string_view name, int64_t set) const {
  return in_set(name, set);
}

DeviceTensor TierWorkspace::in_set(std::string_view name, int64_t set) const {
  TIERMOE_ASSERT(set >= 0 && set < kWorkspaceSets, "workspace set ", set);
  DeviceTensor t = layout_.tensor(buffer_, name);
  t.offset += size_t(set) * layout_.bytes;
  return t;
}

void TierLayerStats::add(const TierLayerStats& o) {
  rows += o.rows;
  device_rows += o.device_rows;
  padded_rows += o.padded_rows;
  device_calls += o.device_calls;
  bytes_up += o.bytes_up;
  bytes_down += o.bytes_down;
  host_s += o.host_s;
  wait_s += o.wait_s;
  device_s += o.device_s;
  transfer_s += o.transfer_s;
  faults += o.faults;
}

}  // namespace tiermoe
