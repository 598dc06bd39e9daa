#pragma once
// Threading. TierMoE's kernels and oneDNN share one pool: Debian's oneDNN is
// built on the GNU OpenMP runtime, so our parallel loops run on the same
// OpenMP threads instead of a second pool fighting it for the cores. The
// thread count is the calling thread's OpenMP setting (like
// torch.set_num_threads on the main thread); threads started later begin at
// the default, every core the process may run on. The CPU device's worker
// sets its own count this way without touching the host's.
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace tiermoe {

void set_num_threads(int n);  // this thread's count; n <= 0 restores the default (all cores)
int num_threads();
int default_num_threads();

// Runs fn(begin, end) over [0, n) split into at most num_threads() contiguous
// chunks of at least `grain` items. Chunks are a pure function of (n, grain,
// threads), so results that depend on chunking are still reproducible.
template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  int64_t chunks = std::min<int64_t>(num_threads(), (n + std::max<int64_t>(grain, 1) - 1) /
                                                        std::max<int64_t>(grain, 1));
  if (chunks <= 1 || omp_in_parallel()) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel for num_threads(int(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    fn(begin, end);
  }
}

}  // namespace tiermoe
