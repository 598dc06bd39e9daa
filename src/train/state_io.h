#pragma once
// Writing and strict reading of optimizer state tensors.
//
// Reading: every expected tensor must be present
// with the right shape and dtype, and nothing unexpected may be left over.
// Copies are staged and only applied by commit(), so a rejected state leaves
// the optimizer untouched.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tiermoe/train/optimizer.h"

namespace tiermoe {

class StateReader {
 public:
  StateReader(const OptimizerState& state, std::string optimizer);

  // Stages a copy of tensor `name` into `into` (same shape and dtype).
  void copy_into(const std::string& name, Tensor& into);
  // Stages the step count `name` (an f64 [1] tensor holding a whole number >= 0).
  void read_step(const std::string& name, int64_t& into);
  // Throws on tensors never asked for; then applies every staged copy.
  void commit();

 private:
  const Tensor& find(const std::string& name);

  std::string optimizer_;
  std::map<std::string, const Tensor*> by_name_;
  std::set<std::string> used_;
  std::vector<std::pair<const Tensor*, Tensor*>> copies_;
  std::vector<std::pair<int64_t, int64_t*>> steps_;
};

// What every optimizer saves per parameter: "<p>.step" (f64 [1], a copy) and,
// for bf16 parameters, "<p>.master" (a view of the f32 master), without which
// a resumed bf16 run could not continue bitwise.
void append_common_state(OptimizerState& out, const Parameter& p, int64_t step);
void read_common_state(StateReader& reader, Parameter& p, int64_t& step);

}  // namespace tiermoe
