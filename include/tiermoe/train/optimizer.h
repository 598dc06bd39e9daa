#pragma once
// The interface the trainer steps. An optimizer holds Parameter handles (the
// model's storage) and its own per-parameter state in the master dtype
// (tag optimizer), allocated when it is constructed.
//
// State as named tensors: state_tensors() lists every tensor a resumed run
// needs to continue bitwise identically, under "<param>.<field>" names
// (e.g. "model.norm.weight.exp_avg"; "<param>.step" is an f64 [1] tensor;
// "<param>.master" is the f32 master of a bf16 parameter). The list is the
// same type as io's NamedTensors, so it goes straight to save_safetensors.
// load_state() checks names, shapes and dtypes strictly: a missing,
// unexpected or mismatched tensor is an Error naming it.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tiermoe/core/tensor.h"
#include "tiermoe/train/parameter.h"

namespace tiermoe {

using OptimizerState = std::vector<std::pair<std::string, Tensor>>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update of every parameter from its current grad with learning rate
  // `lr`; then each bf16 working copy is refreshed from its master.
  virtual void step(double lr) = 0;

  // Views of the live state (they alias it; clone them if they must outlive
  // the next step), except step counts, which are fresh f64 [1] tensors.
  virtual OptimizerState state_tensors() const = 0;
  // Copies `state` into this optimizer (and bf16 masters, then working copies).
  virtual void load_state(const OptimizerState& state) = 0;

  const std::vector<Parameter>& params() const { return params_; }
  // Updates applied to parameter i so far (torch's state["step"]).
  int64_t step_count(size_t i) const { return steps_.at(i); }

 protected:
  explicit Optimizer(std::vector<Parameter> params);

  std::vector<Parameter> params_;
  std::vector<int64_t> steps_;  // per parameter, like torch
};

}  // namespace tiermoe
