#include "tiermoe/remat/policy.h"

#include <algorithm>

#include "tiermoe/core/error.h"

namespace tiermoe {

const std::vector<RematRegionKind>& remat_region_kinds() {
  static const std::vector<RematRegionKind> kinds = {
      {"router", false, true}, {"dispatch", true, false}, {"w13", true, true},
      {"act", true, true},     {"w2", true, true},        {"combine", false, true},
      {"shared", true, true},  {"attention", true, true}, {"norm", true, false},
      {"mlp", true, true},
  };
  return kinds;
}

std::string remat_region_names() {
  std::string out;
  for (const auto& k : remat_region_kinds()) {
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

namespace {

// Index of `kind` in remat_region_kinds(), or -1.
int kind_index(std::string_view kind) {
  const auto& kinds = remat_region_kinds();
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i].name == kind) return int(i);
  }
  return -1;
}

int checked_kind_index(std::string_view kind, std::string_view where) {
  int i = kind_index(kind);
  TIERMOE_CHECK(i >= 0, "unknown remat region '" + std::string(kind) + "'", std::string(where),
                "valid regions: " + remat_region_names());
  return i;
}

}  // namespace

RematPolicy RematPolicy::parse(std::string_view text, std::string_view where) {
  const auto& kinds = remat_region_kinds();
  std::vector<bool> keep(kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) {
    const RematRegionKind& k = kinds[i];
    if (text == "none") keep[i] = true;
    else if (text == "full") keep[i] = !k.replayable;
    else if (text == "default") keep[i] = k.in_default || !k.replayable;
    else if (text == "save-w2-only") keep[i] = !k.replayable || k.name == "w2";
  }
  if (text == "none" || text == "full" || text == "default" || text == "save-w2-only") {
    return RematPolicy(std::string(text), std::move(keep));
  }
  constexpr std::string_view prefix = "save:";
  TIERMOE_CHECK(text.starts_with(prefix), "unknown remat policy '" + std::string(text) + "'",
                std::string(where),
                "use none, full, default, save-w2-only, or save:<region>,<region>,... with "
                "regions from: " + remat_region_names());
  for (size_t i = 0; i < kinds.size(); ++i) keep[i] = !kinds[i].replayable;
  std::string_view list = text.substr(prefix.size());
  TIERMOE_CHECK(!list.empty(), "remat policy 'save:' names no region", std::string(where),
                "list the regions to keep, e.g. save:w13,w2 (valid regions: " +
                    remat_region_names() + "), or use full to keep none");
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view kind = list.substr(0, comma);
    TIERMOE_CHECK(!kind.empty(), "empty region name in remat policy '" + std::string(text) + "'",
                  std::string(where), "separate region names by single commas, e.g. save:w13,w2");
    keep[size_t(checked_kind_index(kind, where))] = true;
    if (comma == std::string_view::npos) break;
    list = list.substr(comma + 1);
    TIERMOE_CHECK(!list.empty(), "trailing comma in remat policy '" + std::string(text) + "'",
                  std::string(where), "e.g. save:w13,w2");
  }
  std::string name(prefix);
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (keep[i] && kinds[i].replayable) {
      if (name.size() > prefix.size()) name += ",";
      name += kinds[i].name;
    }
  }
  if (name.size() == prefix.size()) name = "full";  // only never-replayed regions named
  return RematPolicy(std::move(name), std::move(keep));
}

bool RematPolicy::saves(std::string_view region) const {
  size_t dot = region.rfind('.');
  std::string_view kind = dot == std::string_view::npos ? region : region.substr(dot + 1);
  return keep_[size_t(checked_kind_index(kind, "remat policy " + name_))];
}

MoeRegionKeep RematPolicy::moe_keep() const {
  MoeRegionKeep keep;
  for (MoeRegion r : kMoeRegions) keep.set(r, saves(r));
  return keep;
}

}  // namespace tiermoe
