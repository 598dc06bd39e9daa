#include "tiermoe/remat/report.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace tiermoe {

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < std::size(units)) v /= 1024.0, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

void SavedTensorsReport::add_moe_layer(std::string_view layer,
                                       const std::vector<MoeSavedItem>& items) {
  for (const MoeSavedItem& item : items) {
    rows_.push_back({std::string(layer), std::string(moe_region_name(item.region)), item.name,
                     item.dtype, item.shape, item.bytes, item.tracked});
  }
}

std::vector<std::string> SavedTensorsReport::layers() const {
  std::vector<std::string> out;
  for (const Row& r : rows_) {
    if (std::find(out.begin(), out.end(), r.layer) == out.end()) out.push_back(r.layer);
  }
  return out;
}

size_t SavedTensorsReport::bytes(std::string_view layer) const {
  size_t total = 0;
  for (const Row& r : rows_) {
    if (r.tracked && (layer.empty() || r.layer == layer)) total += r.bytes;
  }
  return total;
}

size_t SavedTensorsReport::index_bytes(std::string_view layer) const {
  size_t total = 0;
  for (const Row& r : rows_) {
    if (!r.tracked && (layer.empty() || r.layer == layer)) total += r.bytes;
  }
  return total;
}

size_t SavedTensorsReport::region_bytes(std::string_view layer, std::string_view region) const {
  size_t total = 0;
  for (const Row& r : rows_) {
    if (r.tracked && r.layer == layer && r.region == region) total += r.bytes;
  }
  return total;
}

std::string SavedTensorsReport::to_table() const {
  std::string out;
  char line[256];
  auto row = [&](const std::string& region, const std::string& name, const std::string& dtype,
                 const std::string& shape, const std::string& bytes, const std::string& note) {
    std::snprintf(line, sizeof line, "%-28s %-12s %-5s %-16s %12s  %s", region.c_str(),
                  name.c_str(), dtype.c_str(), shape.c_str(), bytes.c_str(), note.c_str());
    std::string_view text(line);
    out.append(text.substr(0, text.find_last_not_of(' ') + 1));
    out += '\n';
  };
  if (!policy_.empty()) out += "remat policy: " + policy_ + "\n";
  row("region", "tensor", "dtype", "shape", "bytes", "");
  for (const std::string& layer : layers()) {
    for (const Row& r : rows_) {
      if (r.layer != layer) continue;
      row(r.layer + "." + r.region, r.name, r.dtype, shape_str(r.shape), format_bytes(r.bytes),
          r.tracked ? "" : "(plan index, host)");
    }
    row(layer, "total", "", "", format_bytes(bytes(layer)),
        std::to_string(bytes(layer)) + " B saved + " + format_bytes(index_bytes(layer)) +
            " plan indices");
  }
  row("run", "total", "", "", format_bytes(bytes()),
      std::to_string(bytes()) + " B saved + " + format_bytes(index_bytes()) + " plan indices");
  return out;
}

std::string SavedTensorsReport::to_json(int indent) const {
  nlohmann::json layers_json = nlohmann::json::array();
  for (const std::string& layer : layers()) {
    nlohmann::json regions = nlohmann::json::array();
    for (const Row& r : rows_) {
      if (r.layer != layer) continue;
      const std::string full = layer + "." + r.region;
      auto it = std::find_if(regions.begin(), regions.end(),
                             [&](const nlohmann::json& g) { return g["name"] == full; });
      if (it == regions.end()) {
        regions.push_back({{"name", full}, {"bytes", region_bytes(layer, r.region)},
                           {"tensors", nlohmann::json::array()}});
        it = regions.end() - 1;
      }
      (*it)["tensors"].push_back({{"name", r.name}, {"dtype", r.dtype},
                                           {"shape", r.shape}, {"bytes", r.bytes},
                                           {"tracked", r.tracked}});
    }
    layers_json.push_back({{"name", layer}, {"bytes", bytes(layer)},
                           {"index_bytes", index_bytes(layer)}, {"regions", regions}});
  }
  nlohmann::json j = {{"policy", policy_}, {"layers", layers_json}, {"bytes", bytes()},
                      {"index_bytes", index_bytes()}};
  return j.dump(indent);
}

}  // namespace tiermoe
