#pragma once
// Internal: one HF tensor of a CausalLM, as params() and the loader see it.
#include <functional>

#include "tiermoe/model/causal_lm.h"

namespace tiermoe {

struct CausalLM::Slot {
  ModelParam param;                       // views into the model's storage
  std::function<void(bool)> set_requires_grad;  // sets the tensor's whole group
};

}  // namespace tiermoe
