// GEMM throughput on Qwen3-30B-A3B expert shapes (D 2048, F 768): the six
// products of one expert's two linear layers, forward, dx and dW, at the row
// counts an expert sees. Baselines in the same run, for ratios: the ref
// kernel at 1 and 8 rows, and the cpu kernel on 1 thread.
//
//   tiermoe_bench --benchmark_filter=gemm --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <time.h>

#include <string>

#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/kernels/matmul.h"

namespace tiermoe {
namespace {

constexpr int64_t kD = 2048, kF = 768;

enum class Op { forward, dx, dw };

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Layer {
  const char* name;
  int64_t N, K;  // weight [N, K]
};
constexpr Layer kW13{"w13", 2 * kF, kD};  // gate and up rows: [2F, D]
constexpr Layer kW2{"w2", kD, kF};        // [D, F]

Tensor random(Shape shape, DType dt, Rng& rng) {
  Tensor t = Tensor::empty(std::move(shape), dt);
  fill_normal(t, rng, 0.0, 1.0);
  return t;
}

// One product with its operands, as training runs it: activations and
// forward outputs in the compute dtype; weight gradients accumulate into
// f32 (bf16 training keeps fp32 gradients; f64 stays f64).
struct Problem {
  Op op;
  bool use_ref;
  Tensor out, a, b;

  Problem(Op op_, const Layer& l, int64_t M, DType dt, bool ref) : op(op_), use_ref(ref) {
    Rng rng(1);
    Tensor w = random({l.N, l.K}, dt, rng);
    switch (op) {
      case Op::forward:
        out = Tensor::zeros({M, l.N}, dt), a = random({M, l.K}, dt, rng), b = w;
        break;
      case Op::dx:
        out = Tensor::zeros({M, l.K}, dt), a = random({M, l.N}, dt, rng), b = w;
        break;
      case Op::dw:
        out = Tensor::zeros({l.N, l.K}, dt == DType::f64 ? dt : DType::f32);
        a = random({M, l.N}, dt, rng), b = random({M, l.K}, dt, rng);
        break;
    }
  }

  void run() {
    switch (op) {
      case Op::forward:
        use_ref ? ref::matmul_forward(out, a, b) : cpu::matmul_forward(out, a, b);
        break;
      case Op::dx:
        use_ref ? ref::matmul_backward_dx(out, a, b) : cpu::matmul_backward_dx(out, a, b);
        break;
      case Op::dw:
        use_ref ? ref::matmul_backward_dw(out, a, b, true)
                : cpu::matmul_backward_dw(out, a, b, true);
        break;
    }
  }
};

void bm_gemm(benchmark::State& state, Op op, Layer layer, DType dt, bool use_ref, int threads) {
  int64_t M = state.range(0);
  set_num_threads(threads);
  Problem p(op, layer, M, dt, use_ref);
  // The first product of a shape creates its oneDNN primitive (JIT code) and
  // the first of a process is slower still: keep both out of the timing.
  for (int i = 0; i < (use_ref ? 1 : 3); ++i) p.run();
  double cpu_start = process_cpu_seconds();
  for (auto _ : state) {
    p.run();
    benchmark::ClobberMemory();
  }
  double cpu_seconds = process_cpu_seconds() - cpu_start;
  double flops = 2.0 * double(M) * double(layer.N) * double(layer.K);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // Per core-second the process actually ran (all threads): robust to other
  // processes sharing the cores, where wall-clock rates are not. OpenMP
  // threads spinning at barriers count too, so this errs low.
  state.counters["GFLOP/core-s"] = flops * 1e-9 * double(state.iterations()) / cpu_seconds;
  set_num_threads(0);
}

const char* op_name(Op op) {
  switch (op) {
    case Op::forward:
      return "fwd";
    case Op::dx:
      return "dx";
    case Op::dw:
      return "dw";
  }
  return "?";
}

const bool registered = [] {
  const int64_t rows[] = {1, 8, 32, 128, 512, 2048};
  int all = default_num_threads();
  auto add = [](const std::string& name, Op op, Layer l, DType dt, bool ref, int threads) {
    return benchmark::RegisterBenchmark(name.c_str(), bm_gemm, op, l, dt, ref, threads)
        ->UseRealTime()  // oneDNN's OpenMP workers do the work; CPU time would see one thread
        ->Unit(benchmark::kMicrosecond);
  };
  for (DType dt : {DType::bf16, DType::f32}) {
    std::string d(dtype_name(dt));
    for (Layer l : {kW13, kW2}) {
      for (Op op : {Op::forward, Op::dx, Op::dw}) {
        auto* b =
            add("gemm/" + d + "/" + l.name + "_" + op_name(op) + "/threads:" + std::to_string(all),
                op, l, dt, false, all);
        for (int64_t m : rows) b->Arg(m);
      }
    }
    // Baselines for ratios in the same run.
    auto* one = add("gemm/" + d + "/w13_fwd/threads:1", Op::forward, kW13, dt, false, 1);
    for (int64_t m : rows) one->Arg(m);
    add("gemm_ref/" + d + "/w13_fwd/threads:1", Op::forward, kW13, dt, true, 1)->Arg(1)->Arg(8);
  }
  // f64, the parity mode, runs on TierMoE's own GEMM: how slow is it?
  add("gemm/f64/w13_fwd/threads:" + std::to_string(all), Op::forward, kW13, DType::f64, false, all)
      ->Arg(8)
      ->Arg(128)
      ->Arg(512);
  add("gemm/f64/w13_dw/threads:" + std::to_string(all), Op::dw, kW13, DType::f64, false, all)
      ->Arg(128);
  return true;
}();

}  // namespace
}  // namespace tiermoe
