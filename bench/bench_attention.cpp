// The attention core (kernels/attention.h) at Qwen3-30B-A3B's shapes (32
// query heads over 4 kv heads, head dim 128), causal, B = 2 x T = 1024, on
// every thread: forward, and backward (dq, dk, dv), in bf16 and f32. Flops
// count the causal pairs only (T (T + 1) / 2 per head): the forward's two
// products (S = Q K^T, O = P V), the backward's five (S and dP recomputed,
// dV, dK, dQ). `of_peak` sets the rate against the multiply-add peak of as
// many threads measured in the same run (kernels/cpu_peak.h).
//
//   tiermoe_bench --benchmark_filter=attention
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/kernels/attention.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/kernels/cpu_peak.h"

namespace tiermoe {
namespace {

constexpr int64_t B = 2, T = 1024, Hq = 32, Hkv = 4, P = 128;

void bm_attention(benchmark::State& state, DType dt, bool backward) {
  Rng rng(1);
  auto make = [&](int64_t heads) {
    Tensor t = Tensor::empty({B, T, heads, P}, dt);
    fill_normal(t, rng, 0.0, 1.0);
    return t;
  };
  Tensor q = make(Hq), k = make(Hkv), v = make(Hkv), dout = make(Hq);
  Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty({B, T, Hq}, DType::f32);
  Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt),
         dv = Tensor::empty(v.shape(), dt);
  cpu::attention_forward(out, lse, q, k, v);
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (backward) {
      cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    } else {
      cpu::attention_forward(out, lse, q, k, v);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double pairs = double(B * Hq) * double(T) * double(T + 1) / 2;
  const double flops = (backward ? 10.0 : 4.0) * pairs * double(P);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const double peak = measure_peak_flops(cpu_isa(), dt, num_threads());
  state.counters["of_peak"] = flops * double(state.iterations()) / seconds / peak;
  state.SetLabel(std::string(cpu_isa_name(cpu_isa())) + ", " + std::to_string(num_threads()) +
                 " threads");
}

const bool registered = [] {
  for (DType dt : {DType::bf16, DType::f32}) {
    for (bool backward : {false, true}) {
      const std::string name = "attention/" + std::string(dtype_name(dt)) +
                               (backward ? "/backward" : "/forward") + "/B2_T1024_H32_4_P128";
      benchmark::RegisterBenchmark(name.c_str(), bm_attention, dt, backward)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(3);
    }
  }
  return true;
}();

}  // namespace
}  // namespace tiermoe
