// tiermoe bench peak: the multiply-add peak and the memory read bandwidth the
// other benchmarks set their rates against (kernels/cpu_peak.h), on their
// own: for f32 and bf16 products on the process's ISA, and a stream read,
// with as many threads as a run would use, each measured twice and the
// higher kept (a slow stretch of a shared host reads low).
// Scripts that compare whole steps (bench/compare/step.sh) call it before
// and after their runs. --json prints one object on the last line.
#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "flag_bounds.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/kernels/cpu_peak.h"

namespace tiermoe::cli {

namespace {

struct BenchPeakOptions {
  int threads = 0;
  double seconds = 0.5;
  bool json = false;
};

void run_bench_peak(const BenchPeakOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const int threads = num_threads();
  const CpuIsa isa = cpu_isa();
  nlohmann::json j = {{"isa", cpu_isa_name(isa)}, {"threads", threads}};
  for (DType dt : {DType::f32, DType::bf16}) {
    double best = 0;
    for (int round = 0; round < 2; ++round) {
      best = std::max(best, measure_peak_flops(isa, dt, threads, o.seconds));
    }
    j[std::string(dtype_name(dt)) + "_flops"] = best;
    if (!o.json) {
      std::cout << dtype_name(dt) << " multiply-add peak  " << best * 1e-9 << " GFLOP/s ("
                << cpu_isa_name(isa) << ", " << threads << " threads)\n";
    }
  }
  double bandwidth = 0;
  for (int round = 0; round < 2; ++round) {
    bandwidth = std::max(bandwidth, measure_read_bandwidth(threads, o.seconds));
  }
  j["read_bytes_per_s"] = bandwidth;
  if (!o.json) {
    std::cout << "memory read bandwidth  " << bandwidth * 1e-9 << " GB/s (a 512 MiB stream, "
              << threads << " threads)\n";
  }
  if (o.json) std::cout << j.dump() << "\n";
}

}  // namespace

void add_bench_peak(CLI::App* bench) {
  auto o = std::make_shared<BenchPeakOptions>();
  CLI::App* p = bench->add_subcommand(
      "peak",
      "The ISA's multiply-add peak in f32 and bf16, and the memory read bandwidth, measured now");
  p->fallthrough();
  p->add_option("--threads", o->threads, "Threads (0: all cores)")
      ->capture_default_str()
      ->check(count_in(0, max_threads(), "4 x the cores: more only oversubscribe them"));
  p->add_option("--seconds", o->seconds, "Seconds of each measurement")
      ->capture_default_str()
      ->check(number_in(0.01, 60, "seconds"));
  p->add_flag("--json", o->json, "Print one JSON object on stdout");
  p->callback([o] { run_bench_peak(*o); });
}

}  // namespace tiermoe::cli
