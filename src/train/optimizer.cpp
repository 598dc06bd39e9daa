#include "tiermoe/train/optimizer.h"

#include <set>

namespace tiermoe {

Optimizer::Optimizer(std::vector<Parameter> params)
    : params_(std::move(params)), steps_(params_.size(), 0) {
  std::set<std::string> names;
  for (const Parameter& p : params_) {
    TIERMOE_CHECK(p.value.defined() && p.master.defined() && p.grad.defined(),
                  "parameter is missing its value, master or grad tensor", p.name,
                  "build parameters with Parameter::create or Parameter::wrap");
    TIERMOE_CHECK(names.insert(p.name).second, "parameter listed twice", p.name,
                  "give the optimizer each trainable tensor once");
  }
}

}  // namespace tiermoe
