#include "tiermoe/kernels/cpu_peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

#include "gemm/microkernel.h"
#include "tiermoe/core/error.h"

namespace tiermoe {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

double measure_peak_flops(CpuIsa isa, DType dt, int threads, double seconds) {
  TIERMOE_CHECK(cpu_isa_supported(isa),
                detail::str_of("no peak for ", cpu_isa_name(isa), ": ", cpu_isa_missing(isa)),
                "measure_peak_flops", "measure an ISA this machine has");
  if (isa == CpuIsa::onednn || cpu_isa_emulated(isa)) return 0;
  const cpu::gemm::Microkernel& uk = cpu::gemm::microkernel(isa, dt);
  if (!uk.peak) return 0;
  // Calibrate on one thread: double the rounds until a run takes 10 ms.
  int64_t reps = 1 << 12;
  for (;;) {
    const double t0 = now_s();
    uk.peak(reps);
    if (now_s() - t0 > 0.01 || reps > (int64_t(1) << 40)) break;
    reps *= 2;
  }
  const double t0 = now_s();
  uk.peak(reps);
  const int64_t rounds = std::max<int64_t>(1, int64_t(double(reps) * seconds / (now_s() - t0)));
  int64_t flops = 0;
  const double start = now_s();
#pragma omp parallel num_threads(std::max(1, threads)) reduction(+ : flops)
  flops += uk.peak(rounds);
  return double(flops) / (now_s() - start);
}

}  // namespace tiermoe
