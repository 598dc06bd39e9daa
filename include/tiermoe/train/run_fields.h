#pragma once
// The settings that define a training run, declared once: each one's key in
// trainer_state.json, the `train` flags that set it, and how it is written
// and read back. TrainConfig::to_json and from_json walk this list, and
// `train --resume` lays the flags given on its command line over the
// checkpoint's config by it (run_training then refuses any that differ).
// Adding a run-defining flag is one entry here and its CLI option.
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tiermoe/train/trainer_config.h"

namespace tiermoe {

struct RunField {
  const char* key;
  std::vector<std::string> flags;
  std::function<nlohmann::json(const TrainConfig& c)> get;
  // `where` names the source in errors (a trainer_state.json path).
  std::function<void(TrainConfig& c, const nlohmann::json& value, const std::string& where)> set;
  // What a checkpoint written before the field existed means by leaving it
  // out; none: the key is required.
  std::optional<nlohmann::json> absent = std::nullopt;
};

const std::vector<RunField>& run_fields();

}  // namespace tiermoe
