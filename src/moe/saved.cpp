#include "tiermoe/moe/saved.h"

namespace tiermoe {

void SavedTensors::save(std::string name, Tensor t) {
  TIERMOE_ASSERT(t.defined(), "saving an undefined tensor as ", region_, ".", name);
  t.retag(MemTag::saved);
  for (auto& [n, old] : entries_) {
    if (n == name) {
      old = std::move(t);
      return;
    }
  }
  entries_.emplace_back(std::move(name), std::move(t));
}

Tensor SavedTensors::alloc(std::string name, Shape shape, DType dtype) {
  Tensor t = Tensor::empty(std::move(shape), dtype, MemTag::saved, *tracker_);
  save(std::move(name), t);
  return t;
}

bool SavedTensors::has(std::string_view name) const {
  for (const auto& [n, t] : entries_) {
    if (n == name) return true;
  }
  return false;
}

const Tensor& SavedTensors::get(std::string_view name) const {
  for (const auto& [n, t] : entries_) {
    if (n == name) return t;
  }
  throw Error("no saved tensor '" + std::string(name) + "'", region_.empty() ? "saved" : region_,
              "backward needs what its forward saved; was forward run (with the same options)?");
}

std::vector<SavedTensors::Entry> SavedTensors::report() const {
  std::vector<Entry> out;
  for (const auto& [n, t] : entries_) {
    out.push_back({region_.empty() ? n : region_ + "." + n, t.nbytes()});
  }
  return out;
}

size_t SavedTensors::bytes() const {
  size_t total = 0;
  for (const auto& [n, t] : entries_) total += t.nbytes();
  return total;
}

}  // namespace tiermoe
