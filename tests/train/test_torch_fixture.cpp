// AdamW and SGD against torch.optim (1.13, CPU, foreach=False) on the fixed
// float32 data in tests/data/optim/torch_optim.json, written by
// scripts/fixtures/make_optim_fixture.py. Every parameter after every step
// and the final states must match torch bitwise.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "tiermoe/train/adamw.h"
#include "tiermoe/train/sgd.h"

namespace tiermoe {
namespace {

using nlohmann::json;

json load_fixture() {
  std::ifstream in(std::string(TIERMOE_TEST_DATA_DIR) + "/optim/torch_optim.json");
  EXPECT_TRUE(in.good()) << "missing tests/data/optim/torch_optim.json";
  return json::parse(in);
}

// Distance in units in the last place between two floats of the same sign.
int64_t ulp_distance(float a, float b) {
  auto key = [](float x) {
    int32_t i = std::bit_cast<int32_t>(x);
    return i < 0 ? int64_t(INT32_MIN) - i : int64_t(i);
  };
  return std::abs(key(a) - key(b));
}

void set_values(Tensor& t, const json& values) {
  ASSERT_EQ(int64_t(values.size()), t.numel());
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = values[size_t(i)].get<float>();
}

// Passes when `got` equals the fixture bit for bit; reports the worst ulp gap.
::testing::AssertionResult matches(const Tensor& got, const json& want, const std::string& what) {
  if (int64_t(want.size()) != got.numel()) {
    return ::testing::AssertionFailure() << what << ": " << got.numel() << " values, fixture has " << want.size();
  }
  const float* g = got.data<float>();
  int64_t worst = -1, worst_ulps = 0, differing = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    float w = want[size_t(i)].get<float>();
    if (std::bit_cast<uint32_t>(g[i]) == std::bit_cast<uint32_t>(w)) continue;
    ++differing;
    int64_t ulps = ulp_distance(g[i], w);
    if (ulps > worst_ulps) worst_ulps = ulps, worst = i;
  }
  if (differing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << differing << " of " << got.numel()
                                       << " values differ from torch; worst " << worst_ulps
                                       << " ulp at flat " << worst << " (got " << g[worst]
                                       << ", torch " << want[size_t(worst)].get<float>() << ")";
}

std::unique_ptr<Optimizer> make_optimizer(const json& c, std::vector<Parameter> params) {
  const json& o = c["options"];
  if (c["optimizer"] == "adamw") {
    AdamWOptions opts;
    opts.beta1 = o.at("beta1");
    opts.beta2 = o.at("beta2");
    opts.eps = o.at("eps");
    opts.weight_decay = o.at("weight_decay");
    return std::make_unique<AdamW>(std::move(params), opts);
  }
  SgdOptions opts;
  opts.momentum = o.value("momentum", 0.0);
  opts.dampening = o.value("dampening", 0.0);
  opts.weight_decay = o.value("weight_decay", 0.0);
  opts.nesterov = o.value("nesterov", false);
  return std::make_unique<Sgd>(std::move(params), opts);
}

TEST(TorchFixture, EveryStepMatchesTorchBitwise) {
  json fx = load_fixture();
  ASSERT_FALSE(fx["cases"].empty());
  for (const json& c : fx["cases"]) {
    std::string case_name = c["name"];
    SCOPED_TRACE(case_name);
    std::vector<Parameter> params;
    for (const auto& [name, shape] : fx["shapes"].items()) {
      Parameter p = Parameter::create(name, shape.get<Shape>(), DType::f32);
      set_values(p.value, fx["init"][name]);
      params.push_back(p);
    }
    auto opt = make_optimizer(c, params);
    for (size_t step = 0; step < fx["lrs"].size(); ++step) {
      for (Parameter& p : params) set_values(p.grad, fx["grads"][step][p.name]);
      opt->step(fx["lrs"][step].get<double>());
      for (const Parameter& p : params) {
        EXPECT_TRUE(matches(p.value, c["params_after_step"][step][p.name],
                            case_name + " step " + std::to_string(step + 1) + " " + p.name));
      }
    }
    OptimizerState state = opt->state_tensors();
    int64_t compared = 0;
    for (const auto& [name, tensor] : state) {
      if (!c["state"].contains(name)) continue;
      if (tensor.dtype() == DType::f64) {
        EXPECT_EQ(tensor.get(0), c["state"][name][0].get<double>()) << name;
      } else {
        EXPECT_TRUE(matches(tensor, c["state"][name], case_name + " " + name));
      }
      ++compared;
    }
    EXPECT_EQ(compared, int64_t(c["state"].size())) << "state tensors torch has and we do not";
  }
}

}  // namespace
}  // namespace tiermoe
