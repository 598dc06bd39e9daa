// The families TierMoE implements, by ModelFamily and by model_type.
#include <array>

#include "config_io.h"
#include "tiermoe/core/error.h"

namespace tiermoe {

namespace families {

namespace {

// In ModelFamily order.
const std::array<const FamilyDef*, 11>& registry() {
  static const std::array<const FamilyDef*, 11> all = {
      &qwen3_moe(),   &mixtral(),       &olmoe(),       &qwen2_moe(),  &glm4_moe(),   &gpt_oss(),
      &deepseek_v3(), &glm4_moe_lite(), &deepseek_v2(), &minimax_m2(), &qwen3_5_moe()};
  return all;
}

}  // namespace

const FamilyDef& family_def(ModelFamily family) {
  const FamilyDef& def = *registry().at(size_t(family));
  TIERMOE_ASSERT(def.spec.family == family, "families are registered in ModelFamily order");
  return def;
}

const FamilyDef* find_multimodal_family(std::string_view model_type) {
  for (const FamilyDef* def : registry()) {
    if (!def->spec.multimodal_model_type.empty() && def->spec.multimodal_model_type == model_type) {
      return def;
    }
  }
  return nullptr;
}

const FamilyDef* find_family(std::string_view model_type) {
  for (const FamilyDef* def : registry()) {
    if (def->spec.model_type == model_type) return def;
    for (std::string_view alias : def->spec.aliases) {
      if (alias == model_type) return def;
    }
  }
  return nullptr;
}

}  // namespace families

const FamilySpec& family_spec(ModelFamily family) { return families::family_def(family).spec; }

std::string_view family_name(ModelFamily family) { return family_spec(family).model_type; }

std::vector<ModelFamily> all_families() {
  std::vector<ModelFamily> out;
  for (const families::FamilyDef* def : families::registry()) out.push_back(def->spec.family);
  return out;
}

std::string supported_model_types() {
  std::string out;
  for (ModelFamily family : all_families()) {
    const FamilySpec& spec = family_spec(family);
    out += (out.empty() ? "" : ", ") + std::string(spec.model_type);
    for (std::string_view alias : spec.aliases) out += " (" + std::string(alias) + ")";
  }
  return out;
}

}  // namespace tiermoe
