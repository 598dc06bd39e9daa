// tiermoe bench moe-layer: one MoE layer at a preset's shapes (random weights,
// a skewed routing), timed forward / forward + dx (LoRA, frozen experts) /
// forward + dx + dW (full fine-tuning), with what its forward kept for
// backward under a remat policy. --json prints one object on the last line.
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "flag_bounds.h"
#include "tiermoe/core/bounds.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/dist/mpi_comm.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/moe/bench.h"
#include "tiermoe/remat/policy.h"
#include "tiermoe/remat/report.h"

namespace tiermoe::cli {

namespace {

using detail::str_of;

struct BenchMoeOptions {
  std::string preset = "qwen3-30b-a3b";
  int64_t tokens = 4096;
  std::string dtype = "bf16";
  std::string mode = "full";
  std::string remat = "none";
  std::string absorb = "auto";
  int iters = 3, warmup = 1, threads = 0;
  double zipf = 1.0;
  uint64_t seed = 0;
  bool json = false;
  int ep = 0;        // ranks (under mpirun); 0: not given
  std::string isa;  // empty: TIERMOE_ISA or the best this CPU has
  bool per_expert = false;
};

void run_bench_moe_layer_on(const BenchMoeOptions& o, MpiComm* mpi) {
  const int ranks = mpi ? mpi->size() : 1;
  TIERMOE_CHECK((o.ep == 0 && ranks == 1) || o.ep == ranks,
                str_of("--ep ", o.ep, " with ", ranks, " rank(s) started"), "--ep",
                "start it as mpirun -np N tiermoe bench moe-layer --ep N");
  const bool rank0 = !mpi || mpi->rank() == 0;
  if (o.threads <= 0 && mpi && mpi->local_size() > 1) {
    set_num_threads(std::max(1, default_num_threads() / mpi->local_size()));
  }
  const ModelConfig cfg = preset(o.preset, std::nullopt);
  TIERMOE_CHECK(cfg.num_experts > 0, "preset '" + o.preset + "' has no MoE layers", "--preset",
                "pick a MoE preset");
  const RematPolicy policy = RematPolicy::parse(o.remat);
  if (!o.isa.empty()) set_cpu_isa(parse_cpu_isa(o.isa, "--isa"));

  MoeBenchOptions opt;
  opt.tokens = o.tokens;
  opt.experts = cfg.num_experts;
  opt.top_k = cfg.num_experts_per_tok;
  opt.hidden = cfg.hidden_size;
  opt.ffn = cfg.moe_intermediate_size;
  opt.dtype = parse_dtype(o.dtype);
  TIERMOE_CHECK(opt.dtype != DType::f64, "bench moe-layer runs bf16 or f32", "--dtype",
                "f64 is the parity mode, not a speed mode");
  opt.mode = parse_moe_bench_mode(o.mode);
  opt.absorb_scores = parse_absorb_scores(o.absorb);
  opt.keep = policy.moe_keep();
  opt.zipf_exponent = o.zipf;
  opt.iters = o.iters;
  opt.warmup = o.warmup;
  opt.threads = o.threads;
  opt.seed = o.seed;
  opt.grouped_kernels = !o.per_expert;
  opt.comm = mpi && mpi->size() > 1 ? mpi : nullptr;
  // The layer's weights (and their gradients), and per routed row its input,
  // output and activations (gate, up and their product at width F).
  const std::string what = "the benchmark's memory";
  const int64_t value = int64_t(dtype_size(opt.dtype));
  const int64_t weights = checked_product(
      {opt.experts, 3, opt.hidden, opt.ffn, value, opt.mode == MoeBenchMode::full ? 2 : 1}, what,
      "--preset");
  const int64_t rows = checked_product(
      {opt.tokens, opt.top_k, checked_add(2 * opt.hidden, 3 * opt.ffn, what, "--tokens"), value},
      what, "--tokens");
  check_host_memory(uint64_t(checked_add(weights, rows, what, "--tokens")),
                    str_of("one MoE layer of ", o.preset, " at ", o.tokens, " tokens"), "--tokens",
                    "pass fewer --tokens");

  if (rank0) {
    std::cerr << "bench moe-layer: " << o.preset << " (E " << opt.experts << ", K " << opt.top_k
              << ", D " << opt.hidden << ", F " << opt.ffn << "), T " << opt.tokens << ", "
              << o.dtype << ", mode " << o.mode << ", remat " << policy.name() << ", ISA "
              << cpu_isa_name(cpu_isa()) << ", "
              << (o.threads > 0 ? o.threads : num_threads()) << " threads, " << opt.warmup
              << " warm-up + " << opt.iters << " timed iterations"
              << (ranks > 1 ? str_of(", ", ranks, " ranks (E ", opt.experts / ranks, " each, T ",
                                     opt.tokens, " each)")
                            : std::string())
              << "\n";
  }
  const MoeBenchResult r = run_moe_layer_bench(opt);
  if (!rank0) return;

  SavedTensorsReport report(policy.name());
  report.add_moe_layer(r.layer_name, r.saved);
  if (!o.json) {
    std::cout << "tokens/s        " << r.tokens_per_s << "\n"
              << "TFLOP/s         " << r.tflops << "  (expert GEMMs, 6 N D F per pass)\n"
              << "step time       " << r.seconds << " s (median)\n"
              << "absorbed scores " << (r.absorbed ? "yes" : "no") << "\n"
              << "expert rows     " << r.min_expert_rows << " .. " << r.max_expert_rows << "\n"
              << "ISA             " << r.isa
              << (r.grouped ? " (grouped expert kernels)" : " (per-expert GEMMs)") << "\n"
              << "weight packing  " << r.packs << " stacks, " << r.pack_s << " s, "
              << format_bytes(uint64_t(r.pack_bytes)) << " held\n"
              << (ranks > 1 ? str_of("all-to-all      ", r.alltoall_bytes, " bytes in ",
                                     r.alltoall_s, " s (rank 0, one iteration)\n")
                            : std::string())
              << "retained        " << r.retained_bytes << " bytes ("
              << format_bytes(r.retained_bytes) << ")\n\n"
              << report.to_table();
    return;
  }
  std::cerr << report.to_table();
  nlohmann::json j = nlohmann::json::parse(r.to_json());
  j["preset"] = o.preset;
  j["remat"] = policy.name();
  j["saved_tensors"] = nlohmann::json::parse(report.to_json());
  std::cout << j.dump() << "\n";
}

void run_bench_moe_layer(const BenchMoeOptions& o) {
  if (!launched_by_mpirun()) {
    run_bench_moe_layer_on(o, nullptr);
    return;
  }
  MpiComm mpi(/*timeout_s=*/600);
  try {
    run_bench_moe_layer_on(o, &mpi);
  } catch (const std::exception& e) {
    if (mpi.size() == 1) throw;
    std::cerr << "error: rank " << mpi.rank() << " of " << mpi.size() << ": " << e.what()
              << std::endl;
    mpi.abort(1);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  bench->fallthrough();

  auto o = std::make_shared<BenchMoeOptions>();
  CLI::App* moe = bench->add_subcommand(
      "moe-layer", "One MoE layer at a preset's shapes: tokens/s, TFLOP/s, retained bytes");
  moe->fallthrough();
  moe->add_option("--preset", o->preset, "Model preset giving E, K, D, F")
      ->capture_default_str();
  moe->add_option("--tokens", o->tokens, "Tokens T in the micro-batch")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  moe->add_option("--dtype", o->dtype, "bf16 or f32")->capture_default_str();
  moe->add_option("--mode", o->mode, "fwd | lora (dx only) | full (dx and dW)")
      ->capture_default_str();
  moe->add_option("--remat", o->remat,
                  "Remat policy: none | full | default | save-w2-only | save:<region>,...")
      ->capture_default_str();
  moe->add_option("--absorb-scores", o->absorb, "auto | on | off")->capture_default_str();
  moe->add_option("--iters", o->iters, "Timed iterations (the median is reported)")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  moe->add_option("--warmup", o->warmup, "Untimed iterations first")
      ->capture_default_str()
      ->check(count_in(0, kMaxCount));
  moe->add_option("--threads", o->threads, "Threads (0: all cores)")
      ->capture_default_str()
      ->check(count_in(0, max_threads(), "4 x the cores: more only oversubscribe them"));
  moe->add_option("--zipf", o->zipf, "Routing skew: Zipf exponent of the expert prior (0: none)")
      ->capture_default_str()
      ->check(number_in(0, 100, "0 is uniform routing; about 1 is a typical skew"));
  moe->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  moe->add_flag("--json", o->json, "Print one JSON object on stdout");
  moe->add_option("--ep", o->ep,
                  "Expert parallelism over N ranks (mpirun -np N): each rank runs --tokens "
                  "tokens of its own through E/N of the experts");
  moe->add_option("--isa", o->isa,
                  "GEMM ISA: avx2 | avx512 | avx512bf16 | amx | *-emu | onednn (default: "
                  "TIERMOE_ISA, else the best this CPU has)");
  moe->add_flag("--per-expert", o->per_expert,
                "One GEMM per expert instead of the grouped expert kernels (the baseline)");
  moe->callback([o] { run_bench_moe_layer(*o); });
  add_bench_expert_kernels(bench);
  add_bench_peak(bench);
  add_bench_gated_delta(bench);
}

}  // namespace tiermoe::cli
