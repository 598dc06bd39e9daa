#pragma once
// One MoE layer timed end to end (dispatch, experts, combine; the router too),
// for `tiermoe bench moe-layer` and bench/bench_moe_layer.cpp. Shapes default
// to Qwen3-30B-A3B (E 128, K 8, D 2048, F 768). Routing is skewed like a real
// router's: a Zipf-like prior over experts is folded into the router weights,
// so some experts get many rows and some few.
#include <cstdint>
#include <string>
#include <vector>

#include "tiermoe/core/dtype.h"
#include "tiermoe/dist/comm.h"
#include "tiermoe/moe/moe_layer.h"

namespace tiermoe {

enum class MoeBenchMode { fwd, lora, full };  // forward; + dx (frozen experts); + dx and dW
std::string_view moe_bench_mode_name(MoeBenchMode m);
MoeBenchMode parse_moe_bench_mode(std::string_view s, std::string_view where = "--mode");

struct MoeBenchOptions {
  int64_t tokens = 4096;
  int64_t experts = 128, top_k = 8, hidden = 2048, ffn = 768;
  DType dtype = DType::bf16;
  MoeBenchMode mode = MoeBenchMode::full;
  AbsorbScores absorb_scores = AbsorbScores::automatic;
  MoeRegionKeep keep;          // remat: the regions whose outputs forward keeps
  double zipf_exponent = 1.0;  // 0 = uniform routing
  int warmup = 1, iters = 3;
  int threads = 0;             // 0 = the process default
  uint64_t seed = 0;
  bool grouped_kernels = true;  // false: one GEMM per expert (the baseline)
  // Expert parallelism: P > 1 ranks of this Comm each run `tokens` tokens of
  // their own (seed + rank) through one layer whose experts are split over
  // them (E / P each, an AllToAllDispatcher). Null: one rank, all experts.
  Comm* comm = nullptr;
};

struct MoeBenchResult {
  std::string mode, dtype;
  int64_t tokens = 0;
  int threads = 0;
  bool absorbed = false;
  double seconds = 0;        // median time of one iteration
  double tokens_per_s = 0;
  double tflops = 0;         // expert GEMM flops only: 6*N*D*F per pass (fwd, dx, dW)
  size_t retained_bytes = 0; // what forward kept for backward (MoeSaved::bytes)
  std::string layer_name;    // the layer's regions are "<layer_name>.<region>"
  std::vector<MoeSavedItem> saved;  // one forward's retained tensors (the remat report's rows)
  int64_t max_expert_rows = 0, min_expert_rows = 0;
  // Expert parallelism: the ranks, and this rank's all-to-alls in one
  // iteration (forward and, unless fwd, backward): bytes sent plus
  // received, and seconds inside the collectives (median iteration's).
  // tokens_per_s and tflops then count every rank's tokens.
  int ranks = 1;
  uint64_t alltoall_bytes = 0;
  double alltoall_s = 0;
  // The GEMM ISA the experts ran on (kernels/cpu_isa.h), and the packing of
  // their weights for the grouped kernels (moe/expert_kernels.h): in full
  // mode every iteration re-packs, as a step after the optimizer's update
  // must, and that time is inside `seconds`. packs counts stacks packed
  // (four per re-pack), pack_s their seconds, both over the whole run
  // (warm-up included); pack_bytes is what the packed copies hold.
  std::string isa;
  bool grouped = false;  // the grouped kernels ran (not the per-expert path)
  int64_t packs = 0, pack_bytes = 0;
  double pack_s = 0;

  std::string to_json() const;  // one object with the keys above
};

MoeBenchResult run_moe_layer_bench(const MoeBenchOptions& opt);

}  // namespace tiermoe
