#include "tiermoe/train/parameter.h"

#include <utility>

#include "tiermoe/core/parallel.h"

namespace tiermoe {

namespace {
constexpr int64_t kGrain = 1 << 15;
}

DType Parameter::master_dtype_for(DType working) {
  return working == DType::f64 ? DType::f64 : DType::f32;
}

Parameter Parameter::create(std::string name, Shape shape, DType dtype, MemoryTracker& tracker) {
  Tensor value = Tensor::zeros(std::move(shape), dtype, MemTag::weights, tracker);
  return wrap(std::move(name), std::move(value), Tensor{}, tracker);
}

Parameter Parameter::wrap(std::string name, Tensor value, Tensor grad, MemoryTracker& tracker) {
  TIERMOE_CHECK(value.defined(), "parameter has no tensor", name,
                "wrap the module's weight tensor after it is allocated");
  DType master_dtype = master_dtype_for(value.dtype());
  Parameter p;
  p.name = std::move(name);
  p.value = std::move(value);
  if (p.has_separate_master()) {
    p.master = p.value.to(master_dtype, MemTag::optimizer, tracker);  // bf16 -> f32 is exact
  } else {
    p.master = p.value;
  }
  if (grad.defined()) {
    check_shape(grad, p.value.shape(), p.name + " grad");
    TIERMOE_CHECK(grad.dtype() == master_dtype,
                  detail::str_of("gradient dtype ", dtype_name(grad.dtype()), " for a ",
                                 dtype_name(p.value.dtype()), " parameter; expected ",
                                 dtype_name(master_dtype)),
                  p.name, "gradients are kept in the master dtype (f32, or f64 in f64 runs)");
    p.grad = std::move(grad);
  } else {
    p.grad = Tensor::zeros(p.value.shape(), master_dtype, MemTag::grads, tracker);
  }
  return p;
}

void Parameter::refresh_working() {
  if (!has_separate_master()) return;
  const float* src = master.data<float>();
  bf16* dst = value.data<bf16>();
  parallel_for(numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = float_to_bf16(src[i]);
  });
}

}  // namespace tiermoe
