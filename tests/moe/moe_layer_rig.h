#pragma once
// A small MoE layer with every part built from one seed, and the run that
// collects the output, a scalar loss and every gradient by name.
#include <map>
#include <memory>
#include <string>

#include "moe/moe_test_util.h"
#include "tiermoe/moe/moe_layer.h"

namespace tiermoe::testing {

inline RouterConfig router_config(RouterKind kind, int64_t D, int64_t E, int64_t K) {
  RouterConfig c;
  c.kind = kind, c.hidden = D, c.num_experts = E, c.top_k = K;
  if (kind == RouterKind::softmax_topk) c.norm_topk_prob = true;
  if (kind == RouterKind::deepseek_v3) {
    c.norm_topk_prob = true;
    c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5;
  }
  if (kind == RouterKind::deepseek_v2)
    c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 3.0;
  return c;
}

struct LayerRig {
  static constexpr int64_t T = 10, D = 6, F = 5, E = 8, K = 2;
  DType dtype;
  std::unique_ptr<Router> router;
  std::unique_ptr<GroupedExperts> experts;
  std::unique_ptr<HostExperts> host;
  Tensor x_TD, P_TD;  // input and the loss projection

  LayerRig(RouterKind kind, Variant v, DType dt, uint64_t seed = 1,
           KernelSet kernels = KernelSet::cpu, int64_t tokens = T)
      : dtype(dt) {
    Rng rng(seed);
    router = std::make_unique<Router>(router_config(kind, D, E, K), dt);
    for (const auto& n : router->param_names()) fill_normal(router->param(n), rng, 0.0, 0.5);
    experts = std::make_unique<GroupedExperts>(experts_config(v, E, D, F, kernels), dt);
    fill_experts(*experts, rng);
    host = std::make_unique<HostExperts>(*experts);
    x_TD = random_tensor({tokens, D}, dt, rng);
    P_TD = random_tensor({tokens, D}, dt, rng);
  }

  MoeLayer layer(AbsorbScores absorb, const Dispatcher& d, ExpertExecutor* routed = nullptr,
                 MemoryTracker* tracker = nullptr) {
    MoeLayerConfig c;
    c.absorb_scores = absorb;
    c.tracker = tracker;
    return MoeLayer(c, router.get(), d, routed ? *routed : *host);
  }

  void zero_grad() {
    router->zero_grad();
    experts->zero_grad();
  }

  // out, loss, dx and every parameter grad, by name (clones).
  std::map<std::string, Tensor> run(MoeLayer& layer, bool weight_grads = true) {
    zero_grad();
    MoeSaved saved;
    Tensor out = layer.forward(x_TD, saved, weight_grads);
    Tensor dx = Tensor::empty(x_TD.shape(), dtype);
    layer.backward(dx, P_TD, saved);
    std::map<std::string, Tensor> r;
    r["out"] = out;
    r["loss"] = Tensor::from_values({1}, DType::f64, {projected_loss(out, P_TD)});
    r["dx"] = dx;
    for (const auto& n : router->param_names()) {
      if (router->has_grad(n)) r["router." + n] = router->grad(n).clone();
    }
    for (const auto& n : experts->param_names()) r["experts." + n] = experts->grad(n).clone();
    return r;
  }
};

inline ::testing::AssertionResult all_results_close(const std::map<std::string, Tensor>& got,
                                                    const std::map<std::string, Tensor>& want,
                                                    double rtol) {
  for (const auto& [name, w] : want) {
    auto r = close_scaled(got.at(name), w, rtol, name);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult all_results_bitwise(const std::map<std::string, Tensor>& got,
                                                      const std::map<std::string, Tensor>& want) {
  for (const auto& [name, w] : want) {
    auto r = bitwise_equal(got.at(name), w, name);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tiermoe::testing
