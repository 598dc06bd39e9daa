// The cost model's start-up measurements run end to end at small shapes: they
// drive the real host experts and a CpuDevice through its interface (graph
// arguments the device checks), stay within the memory they announce and
// free it. What the rates are is not checked here (speed belongs in
// benchmarks), only that they are rates.
#include <gtest/gtest.h>

#include <cmath>

#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/cpu_device.h"

namespace tiermoe {
namespace {

bool is_rate(double v) { return std::isfinite(v) && v > 0; }

TEST(CostMeasure, HostRunsTheExpertsOfEachMode) {
  for (TrainMode m : {TrainMode::lora, TrainMode::full}) {
    for (bool absorb : {true, false}) {
      ExpertShape s;
      s.D = 64;
      s.F = 32;
      s.dtype = DType::f32;
      s.absorb = absorb;
      EXPECT_TRUE(is_rate(measure_host(s, m, 1))) << train_mode_name(m);
    }
  }
}

TEST(CostMeasure, DeviceRunsEachGraphWithinItsBytesAndFreesThem) {
  struct Case {
    TrainMode mode;
    DType dtype;
    bool absorb, bias;
    ExpertActivation act;
  };
  const Case cases[] = {
      {TrainMode::lora, DType::f32, true, false, ExpertActivation::swiglu},
      {TrainMode::full, DType::bf16, true, false, ExpertActivation::swiglu},
      {TrainMode::full, DType::f32, false, false, ExpertActivation::swiglu},
      {TrainMode::full, DType::f32, true, true, ExpertActivation::gpt_oss},
  };
  for (const Case& c : cases) {
    ExpertShape s;
    s.D = 64;
    s.F = 32;
    s.dtype = c.dtype;
    s.absorb = c.absorb;
    s.bias = c.bias;
    s.activation = c.act;
    const std::vector<int64_t> buckets = bucket_ladder(16, 64);
    CpuDeviceConfig cfg;
    cfg.memory_bytes = measure_device_bytes(s, c.mode, buckets);
    cfg.threads = 1;
    CpuDevice dev(cfg);
    const DeviceRates r = measure_device(dev, s, c.mode, buckets);
    EXPECT_TRUE(is_rate(r.flops_per_s));
    EXPECT_TRUE(is_rate(r.link_bytes_per_s));
    EXPECT_TRUE(std::isfinite(r.launch_s) && r.launch_s >= 0);
    EXPECT_EQ(dev.used(), 0u);
    const DeviceCounters n = dev.counters();
    const std::string bwd(graph_kind_name(backward_graph_kind(c.mode)));
    int64_t bwd_calls = 0;
    for (const auto& [key, calls] : n.calls) {
      if (key.find(bwd) != std::string::npos && key.find(" G64 ") != std::string::npos) {
        bwd_calls += calls;
      }
    }
    EXPECT_GT(bwd_calls, 0) << "the mode's backward graph ran at the largest bucket";
  }
}

}  // namespace
}  // namespace tiermoe
