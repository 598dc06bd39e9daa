#include "tiermoe/train/adamw.h"

#include <cmath>

#include "state_io.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe {

namespace {

constexpr int64_t kGrain = 1 << 14;

// One step's scalars, computed in double as torch.optim computes them in
// Python, then rounded to T where torch hands them to a T kernel.
template <class T>
struct AdamWCoefs {
  T decay, beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps;
};

template <class T>
AdamWCoefs<T> adamw_coefs(const AdamWOptions& o, double lr, double weight_decay, int64_t step) {
  double bias_correction1 = 1.0 - std::pow(o.beta1, double(step));
  double bias_correction2 = 1.0 - std::pow(o.beta2, double(step));
  double step_size = lr / bias_correction1;
  return {T(1.0 - lr * weight_decay), T(o.beta1),          T(1.0 - o.beta1),
          T(o.beta2),                 T(1.0 - o.beta2),    T(-step_size),
          T(std::sqrt(bias_correction2)), T(o.eps)};
}

// The order of operations is torch's; see adamw.h before changing any of it.
// With `working` (a bf16 parameter's working copy) the new master value is
// rounded into it in the same pass, as Parameter::refresh_working would in a
// second one (the step is bound by memory traffic).
template <class T>
void adamw_update(T* p, T* m, T* v, const T* g, int64_t n, const AdamWCoefs<T>& c,
                  bf16* working) {
  bool decay = c.decay != T(1);
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T pi = decay ? p[i] * c.decay : p[i];
      T mi = std::fma(g[i], c.one_minus_beta1, m[i] * c.beta1);
      T vi = std::fma(c.one_minus_beta2 * g[i], g[i], v[i] * c.beta2);
      T denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
      p[i] = pi + c.neg_step_size * mi / denom;
      m[i] = mi;
      v[i] = vi;
    }
    if constexpr (std::is_same_v<T, float>) {
      if (working) {
        for (int64_t i = begin; i < end; ++i) working[i] = float_to_bf16(p[i]);
      }
    }
  });
}

void check_options(const AdamWOptions& o) {
  TIERMOE_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
                detail::str_of("betas (", o.beta1, ", ", o.beta2, ")"), "AdamW",
                "betas must lie in [0, 1), as torch.optim.AdamW requires");
  TIERMOE_CHECK(o.eps >= 0, detail::str_of("eps ", o.eps), "AdamW", "eps must be >= 0");
  TIERMOE_CHECK(o.weight_decay >= 0, detail::str_of("weight_decay ", o.weight_decay), "AdamW",
                "weight decay must be >= 0");
}

}  // namespace

AdamW::AdamW(std::vector<Parameter> params, AdamWOptions options, MemoryTracker& tracker)
    : Optimizer(std::move(params)), options_(options) {
  check_options(options_);
  for (const Parameter& p : params_) {
    exp_avg_.push_back(Tensor::zeros(p.value.shape(), p.master_dtype(), MemTag::optimizer, tracker));
    exp_avg_sq_.push_back(Tensor::zeros(p.value.shape(), p.master_dtype(), MemTag::optimizer, tracker));
  }
}

void AdamW::step(double lr) {
  TIERMOE_CHECK(std::isfinite(lr) && lr >= 0, detail::str_of("learning rate ", lr), "AdamW",
                "the learning rate must be finite and >= 0");
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    int64_t step = ++steps_[i];
    double weight_decay = p.weight_decay ? options_.weight_decay : 0.0;
    visit_dtype(p.master_dtype(), [&]<class T>() {
      if constexpr (std::is_same_v<T, bf16>) {
        TIERMOE_ASSERT(false, "bf16 master for ", p.name);
      } else {
        adamw_update<T>(p.master.data<T>(), exp_avg_[i].data<T>(), exp_avg_sq_[i].data<T>(),
                        p.grad.data<T>(), p.numel(), adamw_coefs<T>(options_, lr, weight_decay, step),
                        p.has_separate_master() ? p.value.data<bf16>() : nullptr);
      }
    });
  }
}

OptimizerState AdamW::state_tensors() const {
  OptimizerState out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i].name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(params_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
    append_common_state(out, params_[i], steps_[i]);
  }
  return out;
}

void AdamW::load_state(const OptimizerState& state) {
  StateReader reader(state, "AdamW state");
  for (size_t i = 0; i < params_.size(); ++i) {
    reader.copy_into(params_[i].name + ".exp_avg", exp_avg_[i]);
    reader.copy_into(params_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
    read_common_state(reader, params_[i], steps_[i]);
  }
  reader.commit();
  for (Parameter& p : params_) p.refresh_working();
}

}  // namespace tiermoe
