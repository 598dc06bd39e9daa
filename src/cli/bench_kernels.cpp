// tiermoe bench expert-kernels: each grouped expert kernel at a preset's
// expert shapes for several rows per expert, its TFLOP/s beside the ISA's
// multiply-add peak measured in the same run. --json prints one object on
// the last line.
#include <iostream>
#include <memory>

#include "commands.h"
#include "flag_bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/moe/kernel_bench.h"

namespace tiermoe::cli {

namespace {

struct BenchKernelOptions {
  std::string preset = "qwen3-30b-a3b";
  std::string dtype = "bf16";
  std::vector<int64_t> rows = {1, 16, 64, 256, 1024};
  int64_t max_rows = 8192;
  int iters = 3, threads = 0;
  std::string isa, experts;
  int64_t group = 128;
  bool json = false;
};

void run_bench_expert_kernels(const BenchKernelOptions& o) {
  if (!o.isa.empty()) set_cpu_isa(parse_cpu_isa(o.isa, "--isa"));
  const ModelConfig cfg = preset(o.preset, std::nullopt);
  TIERMOE_CHECK(cfg.num_experts > 0, "preset '" + o.preset + "' has no MoE layers", "--preset",
                "pick a MoE preset");
  ExpertKernelBenchOptions opt;
  opt.experts = cfg.num_experts;
  opt.hidden = cfg.hidden_size;
  opt.ffn = cfg.moe_intermediate_size;
  opt.dtype = parse_dtype(o.dtype);
  TIERMOE_CHECK(opt.dtype != DType::f64, "bench expert-kernels runs bf16 or f32", "--dtype",
                "f64 stays on the per-expert path");
  opt.rows_per_expert = o.rows;
  opt.max_rows = o.max_rows;
  opt.iters = o.iters;
  opt.threads = o.threads;
  if (!o.experts.empty() && o.experts != o.dtype) {
    opt.quant = parse_quant_format(o.experts, "--experts");
  }
  opt.group = o.group;
  std::cerr << "bench expert-kernels: " << o.preset << " (E " << opt.experts << ", D "
            << opt.hidden << ", F " << opt.ffn << "), " << o.dtype << " products over "
            << (opt.quant ? o.experts : o.dtype) << " weights, ISA "
            << cpu_isa_name(cpu_isa()) << "\n";
  const ExpertKernelBenchResult r = run_expert_kernel_bench(opt);
  if (o.json) {
    std::cerr << r.to_table();
    std::cout << r.to_json() << "\n";
  } else {
    std::cout << r.to_table();
  }
}

}  // namespace

void add_bench_expert_kernels(CLI::App* bench) {
  auto o = std::make_shared<BenchKernelOptions>();
  CLI::App* k = bench->add_subcommand(
      "expert-kernels",
      "Each grouped expert kernel's TFLOP/s by rows per expert, beside the measured peak");
  k->fallthrough();
  k->add_option("--preset", o->preset, "Model preset giving E, D, F")->capture_default_str();
  k->add_option("--dtype", o->dtype, "bf16 or f32")->capture_default_str();
  k->add_option("--rows", o->rows, "Rows per expert, one case each")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  k->add_option("--max-rows", o->max_rows,
                "Fewer experts per case so that it holds at most this many rows")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  k->add_option("--iters", o->iters, "Timed calls per kernel (the median is reported)")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  k->add_option("--threads", o->threads, "Threads (0: all cores)")
      ->capture_default_str()
      ->check(count_in(0, max_threads(), "4 x the cores: more only oversubscribe them"));
  k->add_option("--isa", o->isa,
                "GEMM ISA: avx2 | avx512 | avx512bf16 | amx | *-emu (default: TIERMOE_ISA, else "
                "the best this CPU has)");
  k->add_option("--experts", o->experts,
                "Frozen expert weights stored as int4 | int8 | mxfp4 | fp8 (default: the dtype)");
  k->add_option("--group", o->group, "int4/int8 columns per scale")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  k->add_flag("--json", o->json, "Print one JSON object on stdout");
  k->callback([o] { run_bench_expert_kernels(*o); });
}

}  // namespace tiermoe::cli
