#include "tiermoe/core/parallel.h"

#include <sched.h>

namespace tiermoe {

int default_num_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, omp_get_num_procs());
}

void set_num_threads(int n) { omp_set_num_threads(n > 0 ? n : default_num_threads()); }

int num_threads() { return omp_get_max_threads(); }

}  // namespace tiermoe
