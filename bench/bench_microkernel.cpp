// Each native ISA's GEMM microkernel (src/kernels/cpu/gemm/microkernel.h)
// on one packed A panel and one packed B panel of kc = 256 that stay in L1,
// on one thread: the rate of the instruction chain itself, without packing,
// epilogues or memory traffic. Beside it, in the same run, the ISA's
// register-only multiply-add peak on one thread (kernels/cpu_peak.h); the
// `of_peak` counter is their ratio. ISAs this CPU lacks, and the emulations,
// are not registered.
//
//   tiermoe_bench --benchmark_filter=microkernel --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "../src/kernels/cpu/gemm/driver.h"
#include "../src/kernels/cpu/gemm/microkernel.h"
#include "../src/kernels/cpu/gemm/pack.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/kernels/cpu_peak.h"

namespace tiermoe {
namespace {

void bm_microkernel(benchmark::State& state, CpuIsa isa, DType dt) {
  const cpu::gemm::Microkernel& uk = cpu::gemm::microkernel(isa, dt);
  const int64_t kc = cpu::gemm::kKc;
  // Every packed layout of these panels is a run of bf16 or f32 values; the
  // pattern 0x3a83 is about 1e-3 read either way (two of them as one f32),
  // so the sums stay finite and normal whatever the layout. The panels are
  // Tensors, 64-byte aligned as the driver's buffers are: an AMX tile row
  // that straddles two cache lines runs the kernel at about a third of its
  // speed (measured: 26% of the peak against 65%).
  Tensor a = Tensor::empty({cpu::gemm::a_panel_bytes(uk, kc) / 2 + 32}, DType::bf16);
  Tensor b = Tensor::empty({cpu::gemm::b_panel_bytes(uk, kc) / 2 + 32}, DType::bf16);
  for (Tensor* t : {&a, &b}) {
    uint16_t* bits = static_cast<uint16_t*>(t->raw());
    std::fill(bits, bits + t->numel(), uint16_t{0x3a83});
  }
  Tensor c = Tensor::zeros({int64_t(uk.mr) * uk.nr}, DType::f32);
  if (uk.thread_begin) uk.thread_begin();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    uk.run(kc, a.raw(), b.raw(), c.data<float>(), uk.nr, true);
    benchmark::DoNotOptimize(c.raw());
    benchmark::ClobberMemory();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (uk.thread_end) uk.thread_end();
  const double flops = 2.0 * double(uk.mr) * double(uk.nr) * double(kc);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const double peak = measure_peak_flops(isa, dt, 1);
  state.counters["peak_GFLOP/s"] = peak * 1e-9;
  state.counters["of_peak"] = flops * double(state.iterations()) / seconds / peak;
  state.SetLabel(std::string(cpu_isa_name(isa)) + " " + std::to_string(uk.mr) + "x" +
                 std::to_string(uk.nr));
}

const bool registered = [] {
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16, CpuIsa::amx}) {
    if (!cpu_isa_supported(isa)) continue;
    for (DType dt : {DType::bf16, DType::f32}) {
      // AVX-512 BF16 and AMX have bf16 microkernels only.
      if (dt == DType::f32 && (isa == CpuIsa::avx512bf16 || isa == CpuIsa::amx)) continue;
      const std::string name = "microkernel/" + std::string(cpu_isa_name(isa)) + "/" +
                               std::string(dtype_name(dt)) + "/kc:256/threads:1";
      benchmark::RegisterBenchmark(name.c_str(), bm_microkernel, isa, dt)
          ->Unit(benchmark::kNanosecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace tiermoe
