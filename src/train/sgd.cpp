#include "tiermoe/train/sgd.h"

#include <cmath>

#include "state_io.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe {

namespace {

constexpr int64_t kGrain = 1 << 14;

template <class T>
struct SgdCoefs {
  T weight_decay, momentum, one_minus_dampening, neg_lr;
  bool has_decay, has_momentum, nesterov, first_step;
};

// The order of operations is torch's: every `x.add(y, alpha=a)` is fma(y, a, x).
template <class T>
void sgd_update(T* p, T* buf, const T* g, int64_t n, const SgdCoefs<T>& c) {
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      T d = c.has_decay ? std::fma(p[i], c.weight_decay, g[i]) : g[i];
      if (c.has_momentum) {
        T b = c.first_step ? d : std::fma(d, c.one_minus_dampening, buf[i] * c.momentum);
        buf[i] = b;
        d = c.nesterov ? std::fma(b, c.momentum, d) : b;
      }
      p[i] = std::fma(d, c.neg_lr, p[i]);
    }
  });
}

void check_options(const SgdOptions& o) {
  TIERMOE_CHECK(o.momentum >= 0, detail::str_of("momentum ", o.momentum), "SGD", "momentum must be >= 0");
  TIERMOE_CHECK(o.weight_decay >= 0, detail::str_of("weight_decay ", o.weight_decay), "SGD",
                "weight decay must be >= 0");
  TIERMOE_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                detail::str_of("nesterov with momentum ", o.momentum, " and dampening ", o.dampening),
                "SGD", "Nesterov momentum requires momentum > 0 and zero dampening (as torch.optim.SGD)");
}

}  // namespace

Sgd::Sgd(std::vector<Parameter> params, SgdOptions options, MemoryTracker& tracker)
    : Optimizer(std::move(params)), options_(options) {
  check_options(options_);
  for (const Parameter& p : params_) {
    momentum_buffer_.push_back(options_.momentum != 0
                                   ? Tensor::zeros(p.value.shape(), p.master_dtype(),
                                                   MemTag::optimizer, tracker)
                                   : Tensor{});
  }
}

void Sgd::step(double lr) {
  TIERMOE_CHECK(std::isfinite(lr) && lr >= 0, detail::str_of("learning rate ", lr), "SGD",
                "the learning rate must be finite and >= 0");
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    bool first_step = steps_[i]++ == 0;
    double weight_decay = p.weight_decay ? options_.weight_decay : 0.0;
    visit_dtype(p.master_dtype(), [&]<class T>() {
      if constexpr (std::is_same_v<T, bf16>) {
        TIERMOE_ASSERT(false, "bf16 master for ", p.name);
      } else {
        SgdCoefs<T> c{T(weight_decay), T(options_.momentum), T(1.0 - options_.dampening), T(-lr),
                      weight_decay != 0, options_.momentum != 0, options_.nesterov, first_step};
        T* buf = c.has_momentum ? momentum_buffer_[i].data<T>() : nullptr;
        sgd_update<T>(p.master.data<T>(), buf, p.grad.data<T>(), p.numel(), c);
      }
    });
    p.refresh_working();
  }
}

OptimizerState Sgd::state_tensors() const {
  OptimizerState out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (momentum_buffer_[i].defined()) {
      out.emplace_back(params_[i].name + ".momentum_buffer", momentum_buffer_[i]);
    }
    append_common_state(out, params_[i], steps_[i]);
  }
  return out;
}

void Sgd::load_state(const OptimizerState& state) {
  StateReader reader(state, "SGD state");
  for (size_t i = 0; i < params_.size(); ++i) {
    if (momentum_buffer_[i].defined()) {
      reader.copy_into(params_[i].name + ".momentum_buffer", momentum_buffer_[i]);
    }
    read_common_state(reader, params_[i], steps_[i]);
  }
  reader.commit();
  for (Parameter& p : params_) p.refresh_working();
}

}  // namespace tiermoe
