// The LM head with its loss (model/lm_head.h) at Qwen3-30B-A3B's real
// vocabulary (V = 151,936, D = 2048) over a batch of 2 x 1024 tokens, frozen
// as LoRA runs it (forward, loss and dx), on every thread: in bf16, and in
// f32 over bf16 weights (a mapped checkpoint in an f32 run). Flops: the two
// products, 2 N D V each. `of_peak` sets the rate against the multiply-add
// peak of the run's dtype and threads measured in the same run.
//
//   tiermoe_bench --benchmark_filter=lm_head
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/kernels/cpu_peak.h"
#include "tiermoe/model/lm_head.h"

namespace tiermoe {
namespace {

constexpr int64_t N = 2048, D = 2048, V = 151936;

void bm_lm_head(benchmark::State& state, DType dt) {
  Rng rng(1);
  Tensor n_ND = Tensor::empty({N, D}, dt), w_VD = Tensor::empty({V, D}, DType::bf16);
  fill_normal(n_ND, rng, 0.0, 1.0);
  fill_normal(w_VD, rng, 0.0, 0.02);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (auto& t : targets) t = int32_t(rng.below(uint64_t(V)));
  Tensor dn_ND = Tensor::empty({N, D}, dt), no_dw;  // frozen: no dW
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    benchmark::DoNotOptimize(lm_head_loss(dn_ND, no_dw, n_ND, w_VD, targets, kDefaultLmHeadChunk));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double flops = 2 * 2.0 * double(N) * double(D) * double(V);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const double peak = measure_peak_flops(cpu_isa(), dt, num_threads());
  state.counters["of_peak"] = flops * double(state.iterations()) / seconds / peak;
  state.SetLabel(std::string(cpu_isa_name(cpu_isa())) + ", " + std::to_string(num_threads()) +
                 " threads, bf16 weights");
}

const bool registered = [] {
  for (DType dt : {DType::bf16, DType::f32}) {
    const std::string name = "lm_head/" + std::string(dtype_name(dt)) + "/N2048_D2048_V151936";
    benchmark::RegisterBenchmark(name.c_str(), bm_lm_head, dt)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(2);
  }
  return true;
}();

}  // namespace
}  // namespace tiermoe
