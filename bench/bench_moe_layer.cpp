// One MoE layer at Qwen3-30B-A3B shapes (E 128, K 8, D 2048, F 768), random
// weights and a Zipf-skewed router: forward, + dx (frozen experts / LoRA),
// + dx and dW (full fine-tuning), in bf16 and f32.
#include <benchmark/benchmark.h>

#include "tiermoe/core/parallel.h"
#include "tiermoe/moe/bench.h"

namespace {

using tiermoe::DType;
using tiermoe::MoeBenchMode;

void BM_MoeLayer(benchmark::State& state, MoeBenchMode mode, DType dtype) {
  tiermoe::MoeBenchOptions opt;
  opt.tokens = state.range(0);
  opt.mode = mode;
  opt.dtype = dtype;
  opt.warmup = 0;
  opt.iters = 1;
  tiermoe::MoeBenchResult r;
  for (auto _ : state) {
    r = tiermoe::run_moe_layer_bench(opt);
    state.SetIterationTime(r.seconds);
  }
  state.counters["tokens_per_s"] = r.tokens_per_s;
  state.counters["TFLOP/s"] = r.tflops;
  state.counters["retained_MiB"] = double(r.retained_bytes) / (1 << 20);
  state.counters["threads"] = r.threads;
  state.counters["max_rows"] = double(r.max_expert_rows);
  state.counters["min_rows"] = double(r.min_expert_rows);
}

#define TIERMOE_MOE_BENCH(mode, dt)                                                        \
  BENCHMARK_CAPTURE(BM_MoeLayer, mode##_##dt, MoeBenchMode::mode, DType::dt)              \
      ->Arg(1024)->Arg(4096)->UseManualTime()->Iterations(2)->Unit(benchmark::kMillisecond)

TIERMOE_MOE_BENCH(fwd, bf16);
TIERMOE_MOE_BENCH(lora, bf16);
TIERMOE_MOE_BENCH(full, bf16);
TIERMOE_MOE_BENCH(fwd, f32);
TIERMOE_MOE_BENCH(lora, f32);
TIERMOE_MOE_BENCH(full, f32);

}  // namespace
