#include "state_io.h"

#include <cmath>
#include <cstring>

namespace tiermoe {

StateReader::StateReader(const OptimizerState& state, std::string optimizer)
    : optimizer_(std::move(optimizer)) {
  for (const auto& [name, tensor] : state) {
    TIERMOE_CHECK(by_name_.emplace(name, &tensor).second,
                  detail::str_of("duplicate optimizer state tensor '", name, "'"), optimizer_,
                  "each state tensor must appear once");
  }
}

const Tensor& StateReader::find(const std::string& name) {
  auto it = by_name_.find(name);
  TIERMOE_CHECK(it != by_name_.end(), detail::str_of("optimizer state tensor '", name, "' is missing"),
                optimizer_,
                "the state was saved by a different optimizer or for different parameters; "
                "resume with the same optimizer, model and trainable set");
  TIERMOE_CHECK(it->second->defined(), detail::str_of("optimizer state tensor '", name, "' is empty"),
                optimizer_, "the checkpoint is corrupt; save it again");
  used_.insert(name);
  return *it->second;
}

void StateReader::copy_into(const std::string& name, Tensor& into) {
  const Tensor& src = find(name);
  check_shape(src, into.shape(), name);
  TIERMOE_CHECK(src.dtype() == into.dtype(),
                detail::str_of("optimizer state tensor '", name, "' is ", dtype_name(src.dtype()),
                               ", expected ", dtype_name(into.dtype())),
                optimizer_,
                "optimizer states follow the compute dtype (f64 runs keep f64 states); resume with "
                "the --dtype the checkpoint was trained with");
  copies_.emplace_back(&src, &into);
}

void StateReader::read_step(const std::string& name, int64_t& into) {
  const Tensor& src = find(name);
  check_shape(src, {1}, name);
  double v = src.get(0);
  TIERMOE_CHECK(std::isfinite(v) && v >= 0 && v == std::floor(v) && v < 9.0e15,
                detail::str_of("optimizer step count '", name, "' is ", v), optimizer_,
                "step counts are whole numbers >= 0; the checkpoint is corrupt");
  steps_.emplace_back(int64_t(v), &into);
}

void StateReader::commit() {
  for (const auto& [name, tensor] : by_name_) {
    TIERMOE_CHECK(used_.count(name), detail::str_of("unexpected optimizer state tensor '", name, "'"),
                  optimizer_,
                  "the state was saved for other parameters or another optimizer; resume with the "
                  "same model, trainable set and optimizer");
  }
  for (auto& [src, dst] : copies_) std::memcpy(dst->raw(), src->raw(), src->nbytes());
  for (auto& [v, dst] : steps_) *dst = v;
}

void append_common_state(OptimizerState& out, const Parameter& p, int64_t step) {
  out.emplace_back(p.name + ".step", Tensor::from_values({1}, DType::f64, {double(step)}, MemTag::optimizer));
  if (p.has_separate_master()) out.emplace_back(p.name + ".master", p.master);
}

void read_common_state(StateReader& reader, Parameter& p, int64_t& step) {
  reader.read_step(p.name + ".step", step);
  if (p.has_separate_master()) reader.copy_into(p.name + ".master", p.master);
}

}  // namespace tiermoe
