#include "tiermoe/train/grad_accum.h"

#include "tiermoe/core/parallel.h"

namespace tiermoe {

namespace {
constexpr int64_t kGrain = 1 << 15;

template <class Fn>
void for_each_grad(std::span<Parameter> params, Fn&& fn) {
  for (Parameter& p : params) {
    visit_dtype(p.grad.dtype(), [&]<class T>() {
      if constexpr (std::is_same_v<T, bf16>) {
        TIERMOE_ASSERT(false, "bf16 gradient for ", p.name);
      } else {
        T* g = p.grad.data<T>();
        parallel_for(p.grad.numel(), kGrain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) g[i] = fn(g[i]);
        });
      }
    });
  }
}
}  // namespace

void zero_grads(std::span<Parameter> params) {
  for (Parameter& p : params) p.grad.zero();
}

void scale_grads(std::span<Parameter> params, double factor) {
  for_each_grad(params, [factor]<class T>(T g) { return g * T(factor); });
}

void average_accumulated_grads(std::span<Parameter> params, int64_t accum_steps) {
  TIERMOE_CHECK(accum_steps >= 1, detail::str_of("accum_steps ", accum_steps), "gradient accumulation",
                "use 1 for no accumulation");
  if (accum_steps == 1) return;
  for_each_grad(params, [accum_steps]<class T>(T g) { return g / T(accum_steps); });
}

}  // namespace tiermoe
