#include "tiermoe/core/step_times.h"

namespace tiermoe {

std::string_view step_part_name(StepPart p) {
  switch (p) {
    case StepPart::data:
      return "data";
    case StepPart::embedding:
      return "embedding";
    case StepPart::norms:
      return "norms";
    case StepPart::projections:
      return "projections";
    case StepPart::attention:
      return "attention";
    case StepPart::router:
      return "router";
    case StepPart::dispatch:
      return "dispatch";
    case StepPart::experts:
      return "experts";
    case StepPart::expert_wait:
      return "expert_wait";
    case StepPart::lm_head:
      return "lm_head";
    case StepPart::optimizer:
      return "optimizer";
  }
  return "?";
}

}  // namespace tiermoe
