// measure_read_bandwidth and roofline_flops (kernels/cpu_peak.h).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "tiermoe/core/error.h"
#include "tiermoe/kernels/cpu_peak.h"

namespace tiermoe {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Sums n floats (n a multiple of 32) with four independent AVX accumulators,
// so that the adds never wait on each other and the loads set the pace.
float stream_sum(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

}  // namespace

double measure_read_bandwidth(int threads, double seconds, size_t bytes) {
  threads = std::max(1, threads);
  // Every thread's slice a whole number of 32-float blocks.
  const size_t block = 32 * sizeof(float) * size_t(threads);
  bytes = std::max(block, bytes / block * block);
  const size_t n = bytes / sizeof(float), slice = n / size_t(threads);
  std::unique_ptr<float, decltype(&std::free)> buf(
      static_cast<float*>(std::aligned_alloc(64, bytes)), &std::free);
  TIERMOE_CHECK(buf != nullptr, detail::str_of("cannot allocate ", bytes, " bytes"),
                "measure_read_bandwidth", "pass a smaller buffer");
  float* p = buf.get();
#pragma omp parallel num_threads(threads)
  {
    float* mine = p + slice * size_t(omp_get_thread_num());
    std::fill(mine, mine + slice, 1.0f);
  }
  // Passes over the whole buffer: one to warm the TLB, then enough for `seconds`.
  volatile float sink = 0;  // the sums are used, so the loads are not optimised away
  auto passes = [&](int count) {
    const double t0 = now_s();
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const float* mine = p + slice * size_t(omp_get_thread_num());
      for (int i = 0; i < count; ++i) total += stream_sum(mine, slice);
    }
    sink = total;
    return now_s() - t0;
  };
  const double one = passes(1);
  const int count = std::max(1, int(seconds / std::max(one, 1e-6)));
  return double(bytes) * count / passes(count);
}

double roofline_flops(double peak_flops, double bytes_per_s, double flops, double bytes) {
  if (peak_flops <= 0 || bytes_per_s <= 0 || bytes <= 0) return 0;
  return std::min(peak_flops, bytes_per_s * flops / bytes);
}

}  // namespace tiermoe
