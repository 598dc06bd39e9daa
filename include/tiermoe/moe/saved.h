#pragma once
// What a forward keeps for its backward, by name. Every tensor saved here is
// re-accounted under MemTag::saved, so the MemoryTracker's "saved" tag is the
// sum over all live records, and a record can list its own bytes per tensor
// (the remat report lists them per region: "moe.routed.h_N2F  12.0 MiB").
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tiermoe/core/tensor.h"

namespace tiermoe {

class SavedTensors {
 public:
  // New tensors saved through alloc() are counted by `tracker`.
  explicit SavedTensors(std::string region = {},
                        MemoryTracker& tracker = MemoryTracker::process())
      : region_(std::move(region)), tracker_(&tracker) {}

  const std::string& region() const { return region_; }
  MemoryTracker& tracker() const { return *tracker_; }

  // A new tensor, allocated under MemTag::saved and kept under `name`, for a
  // forward to write in place (e.g. one expert's rows at a time).
  Tensor alloc(std::string name, Shape shape, DType dtype);

  // Keeps `t` (sharing its storage) and retags that storage as saved. A second
  // save under the same name replaces the first.
  void save(std::string name, Tensor t);
  bool has(std::string_view name) const;
  // Throws an Error naming the region when `name` was not saved.
  const Tensor& get(std::string_view name) const;
  // Drops everything; storage nobody else holds is freed (under "saved").
  void clear() { entries_.clear(); }

  struct Entry {
    std::string name;  // "region.name" in report(), the bare name in entries()
    size_t bytes;
  };
  const std::vector<std::pair<std::string, Tensor>>& entries() const { return entries_; }
  std::vector<Entry> report() const;  // one line per tensor, qualified by the region
  size_t bytes() const;               // sum over the saved tensors

 private:
  std::string region_;
  MemoryTracker* tracker_;
  std::vector<std::pair<std::string, Tensor>> entries_;
};

}  // namespace tiermoe
