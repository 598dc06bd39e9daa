#pragma once
// SavedTensorsReport: what the forwards of a run kept for backward, per
// region: every retained tensor (name, dtype, shape, bytes), totals per layer
// and per run, as a table and as JSON.
//
// Two kinds of rows: tensors, counted by the MemoryTracker under
// MemTag::saved (so `bytes()` of a report over every live forward equals the
// tracker's saved bytes), and the dispatch plans' index arrays (host
// std::vectors no tracker sees), listed for completeness and totalled apart
// as `index_bytes`.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/moe/moe_layer.h"

namespace tiermoe {

class SavedTensorsReport {
 public:
  struct Row {
    std::string layer;   // "model.layers.3.mlp"
    std::string region;  // "w13" (the kind; the full name is layer + "." + region)
    std::string name;    // "h_N2F"
    std::string dtype;   // "bf16", ..., "i32", "i64"
    Shape shape;
    size_t bytes = 0;
    bool tracked = true;  // false: a plan index array
  };

  explicit SavedTensorsReport(std::string policy = {}) : policy_(std::move(policy)) {}

  // One MoE layer's forward (MoeSaved::items(), or MoeBenchResult::saved).
  void add_moe_layer(std::string_view layer, const std::vector<MoeSavedItem>& items);
  void add_moe_layer(std::string_view layer, const MoeSaved& saved) {
    add_moe_layer(layer, saved.items());
  }

  const std::vector<Row>& rows() const { return rows_; }
  std::vector<std::string> layers() const;  // in the order added
  // Tracked tensor bytes and index bytes, of one layer ("" = the whole run).
  size_t bytes(std::string_view layer = {}) const;
  size_t index_bytes(std::string_view layer = {}) const;
  size_t region_bytes(std::string_view layer, std::string_view region) const;

  // One line per row, a total line per layer and one for the run.
  std::string to_table() const;
  // {"policy", "layers": [{"name", "bytes", "index_bytes", "regions": [{"name",
  //  "bytes", "tensors": [{"name", "dtype", "shape", "bytes", "tracked"}]}]}],
  //  "bytes", "index_bytes"}
  std::string to_json(int indent = -1) const;

 private:
  std::string policy_;
  std::vector<Row> rows_;
};

// "12.0 MiB", "4.0 KiB", "96 B": binary units, one decimal.
std::string format_bytes(size_t bytes);

}  // namespace tiermoe
