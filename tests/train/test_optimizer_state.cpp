// Optimizer state as named tensors: a run saved after some steps and
// restored into fresh parameters and a fresh optimizer continues bitwise
// identically; malformed state is rejected without changing anything.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "common/testing.h"
#include "tiermoe/train/adamw.h"
#include "tiermoe/train/sgd.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;
using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Parameter>)>;

std::vector<Parameter> make_params(DType dtype) {
  Rng rng(11);
  std::vector<Parameter> ps = {Parameter::create("model.layers.0.mlp.weight", {4, 33}, dtype),
                               Parameter::create("model.norm.weight", {33}, dtype)};
  for (Parameter& p : ps) {
    fill_normal(p.master, rng, 0.0, 1.0);
    p.refresh_working();
  }
  ps[1].weight_decay = false;
  return ps;
}

void set_grads(std::vector<Parameter>& ps, uint64_t step) {
  Rng rng(100 + step);
  for (Parameter& p : ps) fill_normal(p.grad, rng, 0.0, 0.5);
}

// What a checkpoint holds: working weights and optimizer state, deep-copied.
struct Saved {
  std::vector<Tensor> weights;
  OptimizerState state;
};

Saved save(const std::vector<Parameter>& ps, const Optimizer& opt) {
  Saved s;
  for (const Parameter& p : ps) s.weights.push_back(p.value.clone(MemTag::weights));
  for (const auto& [name, t] : opt.state_tensors()) s.state.emplace_back(name, t.clone());
  return s;
}

void check_resume_is_bitwise(DType dtype, const MakeOptimizer& make) {
  SCOPED_TRACE(dtype_name(dtype));
  std::vector<Parameter> ps = make_params(dtype);
  auto opt = make(ps);
  for (uint64_t s = 0; s < 2; ++s) {
    set_grads(ps, s);
    opt->step(1e-2 * double(s + 1));
  }
  Saved ckpt = save(ps, *opt);

  std::vector<Parameter> resumed;
  for (size_t k = 0; k < ps.size(); ++k) {
    // A fresh model loads its working weights; the masters come from the state.
    Parameter p = Parameter::wrap(ps[k].name, ckpt.weights[k].clone(MemTag::weights));
    p.weight_decay = ps[k].weight_decay;
    resumed.push_back(p);
  }
  auto opt2 = make(resumed);
  opt2->load_state(ckpt.state);
  for (size_t k = 0; k < ps.size(); ++k) EXPECT_EQ(opt2->step_count(k), 2);

  for (uint64_t s = 2; s < 5; ++s) {
    set_grads(ps, s);
    set_grads(resumed, s);
    opt->step(1e-2);
    opt2->step(1e-2);
    for (size_t k = 0; k < ps.size(); ++k) {
      ASSERT_TRUE(bitwise_equal(resumed[k].value, ps[k].value, ps[k].name));
      ASSERT_TRUE(bitwise_equal(resumed[k].master, ps[k].master, ps[k].name + " master"));
    }
  }
  OptimizerState a = opt->state_tensors(), b = opt2->state_tensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bitwise_equal(b[i].second, a[i].second, a[i].first));
  }
}

std::unique_ptr<Optimizer> make_adamw(std::vector<Parameter> ps) {
  return std::make_unique<AdamW>(std::move(ps), AdamWOptions{.weight_decay = 0.1});
}
std::unique_ptr<Optimizer> make_sgd(std::vector<Parameter> ps) {
  return std::make_unique<Sgd>(std::move(ps), SgdOptions{.momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
}

TEST(OptimizerState, AdamWResumesBitwise) {
  for (DType dt : {DType::bf16, DType::f32, DType::f64}) check_resume_is_bitwise(dt, make_adamw);
}

TEST(OptimizerState, SgdResumesBitwise) {
  for (DType dt : {DType::bf16, DType::f32, DType::f64}) check_resume_is_bitwise(dt, make_sgd);
}

TEST(OptimizerState, NamesFollowTheParameters) {
  std::vector<Parameter> ps = make_params(DType::bf16);
  AdamW opt(ps);
  std::vector<std::string> names;
  for (const auto& [name, t] : opt.state_tensors()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "model.layers.0.mlp.weight.exp_avg", "model.layers.0.mlp.weight.exp_avg_sq",
                       "model.layers.0.mlp.weight.step", "model.layers.0.mlp.weight.master",
                       "model.norm.weight.exp_avg", "model.norm.weight.exp_avg_sq",
                       "model.norm.weight.step", "model.norm.weight.master"}));
  std::vector<Parameter> p32 = make_params(DType::f32);
  EXPECT_EQ(AdamW(p32).state_tensors().size(), 6u);  // no separate masters
  EXPECT_EQ(Sgd(p32).state_tensors().size(), 2u);    // steps only, without momentum
}

// Each malformed state is rejected with an Error naming the tensor, and the
// optimizer is left exactly as it was.
TEST(OptimizerState, RejectsMalformedStateWithoutChangingAnything) {
  std::vector<Parameter> ps = make_params(DType::bf16);
  AdamW opt(ps);
  set_grads(ps, 0);
  opt.step(1e-2);
  OptimizerState good;
  for (const auto& [name, t] : opt.state_tensors()) good.emplace_back(name, t.clone());
  for (auto& [name, t] : good) {
    if (t.dtype() != DType::f64) t.fill(0.25);  // distinguishable from the live state
  }
  const std::string m_name = "model.norm.weight.exp_avg";

  std::vector<std::pair<std::string, std::function<void(OptimizerState&)>>> mutations = {
      {m_name, [&](OptimizerState& s) { std::erase_if(s, [&](auto& e) { return e.first == m_name; }); }},
      {"extra", [](OptimizerState& s) { s.emplace_back("extra", Tensor::zeros({1}, DType::f32)); }},
      {m_name, [&](OptimizerState& s) { s.emplace_back(m_name, Tensor::zeros({33}, DType::f32)); }},
      {m_name, [&](OptimizerState& s) {
         for (auto& e : s) if (e.first == m_name) e.second = Tensor::zeros({34}, DType::f32);
       }},
      {m_name, [&](OptimizerState& s) {
         for (auto& e : s) if (e.first == m_name) e.second = Tensor::zeros({33}, DType::f64);
       }},
      {"model.norm.weight.step", [](OptimizerState& s) {
         for (auto& e : s) if (e.first == "model.norm.weight.step") e.second.set(0, 1.5);
       }},
  };
  OptimizerState live_before;
  for (const auto& [name, t] : opt.state_tensors()) live_before.emplace_back(name, t.clone());
  for (auto& [needle, mutate] : mutations) {
    OptimizerState bad = good;
    for (auto& e : bad) e.second = e.second.clone();
    mutate(bad);
    try {
      opt.load_state(bad);
      ADD_FAILURE() << "accepted a state with a bad '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    OptimizerState live = opt.state_tensors();
    for (size_t i = 0; i < live.size(); ++i) {
      ASSERT_TRUE(bitwise_equal(live[i].second, live_before[i].second, live[i].first));
    }
  }
  opt.load_state(good);
  EXPECT_EQ(opt.exp_avg(1).get(0), 0.25);
}

}  // namespace
}  // namespace tiermoe
