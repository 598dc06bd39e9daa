// One MoE layer's experts at Qwen3-30B-A3B shapes (E 128, D 2048, F 768,
// bf16, 1024 tokens x top-8 = 8192 rows, Zipf-1 skewed), forward + backward
// for frozen experts (LoRA: dx only), run by HostExperts on 1 and 2 threads
// and by TieredExperts on a CpuDevice (1 kernel thread, the host keeping 1)
// with the hottest k experts resident, all in the same run.
//
// Reading the ratios: all resident vs the host on 1 thread is what the device
// path itself costs (staging copies, padding to buckets, launches); the
// balanced split vs the host on 2 threads is what running both tiers at once
// gives on a machine whose device is the host's other core.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>

#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/moe/executor.h"
#include "tiermoe/tier/cpu_device.h"
#include "tiermoe/tier/routing_profile.h"
#include "tiermoe/tier/tiered_experts.h"

namespace {

using namespace tiermoe;

constexpr int64_t kE = 128, kD = 2048, kF = 768, kTokens = 1024, kTopK = 8;

// Rows per expert from a Zipf-1 profile, rounded so they sum to T*K.
std::vector<int64_t> expert_rows() {
  const int64_t N = kTokens * kTopK;
  const std::vector<double> share = RoutingProfile::synthetic(1, kE, double(N), 1.0, 7).rows(0);
  std::vector<int64_t> rows(static_cast<size_t>(kE));
  int64_t used = 0;
  for (size_t e = 0; e < rows.size(); ++e) used += rows[e] = int64_t(std::floor(share[e]));
  for (size_t e = 0; used < N; e = (e + 1) % rows.size(), ++used) ++rows[e];
  return rows;
}

struct Layer {
  Layer() : experts(config(), DType::bf16, "bench.experts"), host(experts) {
    Rng rng(1);
    for (const auto& n : experts.param_names()) fill_normal(experts.param(n), rng, 0.0, 0.02);
    count_E = expert_rows();
    offset_E.assign(1, 0);
    for (int64_t c : count_E) offset_E.push_back(offset_E.back() + c);
    const int64_t N = offset_E.back();
    x_ND = Tensor::empty({N, kD}, DType::bf16);
    dy_ND = Tensor::empty({N, kD}, DType::bf16);
    fill_normal(x_ND, rng, 0.0, 1.0);
    fill_normal(dy_ND, rng, 0.0, 1e-3);
    score_N = Tensor::empty({N}, DType::f32);
    fill_uniform(score_N, rng, 0.05, 0.5);
  }
  static ExpertsConfig config() {
    ExpertsConfig c;
    c.num_experts = kE, c.hidden = kD, c.ffn = kF;
    return c;
  }
  // The k hottest experts.
  std::vector<uint8_t> hottest(int64_t k) const {
    std::vector<int64_t> order(static_cast<size_t>(kE));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return count_E[size_t(a)] > count_E[size_t(b)]; });
    std::vector<uint8_t> on(size_t(kE), 0);
    for (int64_t i = 0; i < k; ++i) on[size_t(order[size_t(i)])] = 1;
    return on;
  }
  // The fewest hottest experts holding at least half the rows.
  int64_t half_rows_k() const {
    std::vector<int64_t> sorted = count_E;
    std::sort(sorted.rbegin(), sorted.rend());
    int64_t acc = 0, k = 0;
    while (2 * acc < offset_E.back()) acc += sorted[size_t(k++)];
    return k;
  }
  double step(ExpertExecutor& ex) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t N = offset_E.back();
    Tensor y = Tensor::empty({N, kD}, DType::bf16), dx = Tensor::empty({N, kD}, DType::bf16);
    Tensor dscore = Tensor::empty({N}, DType::f32);
    SavedTensors saved("bench");
    ex.forward(y, x_ND, offset_E, score_N, saved, ExpertSaves{.x = false});
    ex.backward(dx, dscore, dy_ND, offset_E, score_N, saved, false, false);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  GroupedExperts experts;
  HostExperts host;
  std::vector<int64_t> count_E, offset_E;
  Tensor x_ND, dy_ND, score_N;
};

Layer& layer() {
  static Layer l;
  return l;
}

void report(benchmark::State& state, double seconds_per_step) {
  state.counters["tokens_per_s"] = double(kTokens) / seconds_per_step;
  state.counters["TFLOP/s"] = double(kTokens * kTopK) * 12.0 * kD * kF / seconds_per_step / 1e12;
}

void BM_HostExperts(benchmark::State& state) {
  Layer& l = layer();
  set_num_threads(int(state.range(0)));
  double s = 0;
  for (auto _ : state) state.SetIterationTime(s = l.step(l.host));
  report(state, s);
  set_num_threads(0);
}

// range(0): resident experts (hottest first); -1: enough for half the rows.
// range(1): 1 for the bucket ladder with 1.5x midpoints (the default), 0 for
// plain doublings 16, 32, ..., 512 (the padding the midpoints save).
void BM_TieredExperts(benchmark::State& state) {
  Layer& l = layer();
  const int64_t k = state.range(0) < 0 ? l.half_rows_k() : state.range(0);
  const int64_t block = l.experts.config().dw_row_block;
  std::vector<int64_t> buckets = bucket_ladder(16, block);
  if (state.range(1) == 0) {
    buckets.clear();
    for (int64_t g = 16; g <= block; g *= 2) buckets.push_back(g);
  }
  CpuDevice device(CpuDeviceConfig{.memory_bytes = size_t(2) << 30, .threads = 1});
  const ExpertShape shape{kD, kF, DType::bf16};
  TierWorkspace ws(device, shape, block);
  TieredExperts tiered(l.experts, l.host, device, ws, buckets);
  tiered.set_host_threads(1);
  tiered.set_resident(l.hottest(k), false);
  l.step(tiered);  // compiles the graphs
  tiered.take_stats();
  double s = 0;
  for (auto _ : state) state.SetIterationTime(s = l.step(tiered));
  const TierLayerStats t = tiered.take_stats();
  const double iters = double(state.iterations());
  report(state, s);
  state.counters["resident"] = double(k);
  state.counters["hot_fraction"] = t.hot_fraction();
  state.counters["host_s"] = t.host_s / iters;
  state.counters["wait_s"] = t.wait_s / iters;
  state.counters["device_s"] = t.device_s / iters;
  state.counters["padded_rows"] = double(t.padded_rows) / iters;
}

BENCHMARK(BM_HostExperts)->Arg(1)->Arg(2)->UseManualTime()->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TieredExperts)
    ->Args({0, 1})
    ->Args({-1, 1})
    ->Args({kE, 1})
    ->Args({kE, 0})
    ->UseManualTime()
    ->Iterations(2)
    ->Unit(benchmark::kMillisecond);

}  // namespace
