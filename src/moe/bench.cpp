#include "tiermoe/moe/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <sstream>
#include <vector>

#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/moe/alltoall.h"
#include "tiermoe/moe/expert_kernels.h"

namespace tiermoe {

std::string_view moe_bench_mode_name(MoeBenchMode m) {
  switch (m) {
    case MoeBenchMode::fwd: return "fwd";
    case MoeBenchMode::lora: return "lora";
    case MoeBenchMode::full: return "full";
  }
  __builtin_unreachable();
}

MoeBenchMode parse_moe_bench_mode(std::string_view s, std::string_view where) {
  if (s == "fwd") return MoeBenchMode::fwd;
  if (s == "lora") return MoeBenchMode::lora;
  if (s == "full") return MoeBenchMode::full;
  throw Error("unknown bench mode '" + std::string(s) + "'", std::string(where),
              "use fwd, lora (dx only) or full (dx and dW)");
}

std::string MoeBenchResult::to_json() const {
  std::ostringstream os;
  os << "{\"mode\": \"" << mode << "\", \"dtype\": \"" << dtype << "\", \"tokens\": " << tokens
     << ", \"threads\": " << threads << ", \"absorbed\": " << (absorbed ? "true" : "false")
     << ", \"seconds\": " << seconds << ", \"tokens_per_s\": " << tokens_per_s
     << ", \"tflops\": " << tflops << ", \"retained_bytes\": " << retained_bytes
     << ", \"max_expert_rows\": " << max_expert_rows << ", \"min_expert_rows\": " << min_expert_rows
     << ", \"ranks\": " << ranks << ", \"alltoall_bytes\": " << alltoall_bytes
     << ", \"alltoall_s\": " << alltoall_s << ", \"isa\": \"" << isa
     << "\", \"grouped_kernels\": " << (grouped ? "true" : "false") << ", \"packs\": " << packs
     << ", \"pack_bytes\": " << pack_bytes << ", \"pack_s\": " << pack_s << "}";
  return os.str();
}

namespace {

// Random weights fast enough for a billion parameters: one block of normal
// draws, tiled. Throughput does not depend on the values, only on their
// being ordinary (no zeros, no denormals).
void fill_tiled(Tensor& t, Rng& rng, double std) {
  const int64_t block = std::min<int64_t>(t.numel(), 1 << 16);
  Tensor b = Tensor::empty({block}, t.dtype());
  fill_normal(b, rng, 0.0, std);
  char* dst = static_cast<char*>(t.raw());
  for (int64_t i = 0; i < t.numel(); i += block) {
    std::memcpy(dst + size_t(i) * dtype_size(t.dtype()), b.raw(),
                size_t(std::min(block, t.numel() - i)) * dtype_size(t.dtype()));
  }
}

}  // namespace

MoeBenchResult run_moe_layer_bench(const MoeBenchOptions& opt) {
  TIERMOE_CHECK(opt.tokens >= 1 && opt.iters >= 1 && opt.warmup >= 0,
                "bench needs tokens >= 1 and iters >= 1", "bench moe-layer", "");
  if (opt.threads > 0) set_num_threads(opt.threads);
  const int64_t T = opt.tokens, E = opt.experts, K = opt.top_k, D = opt.hidden, F = opt.ffn;
  const int P = opt.comm ? opt.comm->size() : 1, me = opt.comm ? opt.comm->rank() : 0;
  TIERMOE_CHECK(E % P == 0, detail::str_of(E, " experts over ", P, " ranks"), "bench moe-layer",
                "run a number of ranks that divides the expert count");
  const int64_t El = E / P;
  Rng rng(opt.seed);

  RouterConfig rc;
  rc.kind = RouterKind::softmax_topk, rc.hidden = D, rc.num_experts = E, rc.top_k = K;
  rc.norm_topk_prob = true;
  Router router(rc, opt.dtype, "bench.router");
  ExpertsConfig ec;
  ec.num_experts = El, ec.hidden = D, ec.ffn = F;  // this rank's experts
  GroupedExperts experts(ec, opt.dtype, "bench.experts");
  experts.packs().set_enabled(opt.grouped_kernels);
  fill_tiled(experts.param("w13"), rng, 0.02);
  fill_tiled(experts.param("w2"), rng, 0.02);
  HostExperts host(experts);
  // Every rank routes with the same router, over tokens of its own.
  Rng token_rng(opt.seed + 1000 + uint64_t(me));

  // Skew: hidden unit 0 of every token is a constant 1, and the router reads
  // log(zipf prior) from it, so logits = noise + log p_e over a random
  // permutation of ranks; the rest of W is ordinary noise.
  Tensor x = Tensor::empty({T, D}, opt.dtype);
  fill_normal(x, token_rng, 0.0, 1.0);
  for (int64_t t = 0; t < T; ++t) x.set(t * D, 1.0);
  Tensor& w = router.param("weight");
  fill_normal(w, rng, 0.0, 0.02);
  std::vector<int64_t> rank(static_cast<size_t>(E));
  std::iota(rank.begin(), rank.end(), 0);
  for (int64_t i = E - 1; i > 0; --i) std::swap(rank[size_t(i)], rank[rng.below(uint64_t(i + 1))]);
  for (int64_t e = 0; e < E; ++e) {
    w.set(e * D, -opt.zipf_exponent * std::log(double(rank[size_t(e)] + 1)));
  }
  Tensor dout = Tensor::empty({T, D}, opt.dtype);
  fill_normal(dout, token_rng, 0.0, 1.0);
  Tensor dx = Tensor::empty({T, D}, opt.dtype);

  LocalDispatcher local;
  std::unique_ptr<AllToAllDispatcher> alltoall;
  if (P > 1) alltoall = std::make_unique<AllToAllDispatcher>(*opt.comm);
  const Dispatcher& dispatcher = alltoall ? static_cast<const Dispatcher&>(*alltoall) : local;
  MoeLayerConfig lc;
  lc.absorb_scores = opt.absorb_scores;
  lc.name = "bench.moe";
  lc.keep = opt.keep;
  MoeLayer layer(lc, &router, dispatcher, host);

  MoeBenchResult r;
  r.mode = std::string(moe_bench_mode_name(opt.mode));
  r.dtype = std::string(dtype_name(opt.dtype));
  r.tokens = T;
  r.threads = num_threads();
  r.absorbed = layer.absorbs_scores();
  r.layer_name = lc.name;
  r.ranks = P;
  const bool weight_grads = opt.mode == MoeBenchMode::full;
  std::vector<double> times;
  std::vector<std::pair<uint64_t, double>> a2a;  // per timed iteration: bytes, seconds
  for (int it = 0; it < opt.warmup + opt.iters; ++it) {
    // Ranks start each iteration together, so a rank's collectives time the
    // exchange rather than another rank's head start.
    if (opt.comm) opt.comm->barrier("bench iteration");
    const CommStats before = opt.comm ? opt.comm->stats() : CommStats();
    auto start = std::chrono::steady_clock::now();
    // Full fine-tuning changes the weights every step: their packed copies
    // are re-made, and that is part of the step.
    if (weight_grads) experts.weights_changed();
    MoeSaved saved;
    layer.forward(x, saved, weight_grads);
    r.retained_bytes = saved.bytes();
    if (it == 0) {
      r.saved = saved.items();
      r.max_expert_rows = *std::max_element(saved.plan.count_E.begin(), saved.plan.count_E.end());
      r.min_expert_rows = *std::min_element(saved.plan.count_E.begin(), saved.plan.count_E.end());
    }
    if (opt.mode != MoeBenchMode::fwd) layer.backward(dx, dout, saved);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The slowest rank's time is the layer's.
    if (opt.comm) {
      for (double t : opt.comm->allgather_value(s, "bench time")) s = std::max(s, t);
    }
    if (it >= opt.warmup) {
      times.push_back(s);
      const CommOpStats d =
          opt.comm ? opt.comm->stats().since(before)[CommOp::alltoallv] : CommOpStats();
      a2a.emplace_back(d.bytes_sent + d.bytes_received, d.seconds);
    }
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const size_t median_at =
      size_t(std::find(times.begin(), times.end(), sorted[sorted.size() / 2]) - times.begin());
  r.seconds = times[median_at];
  r.alltoall_bytes = a2a[median_at].first;
  r.alltoall_s = a2a[median_at].second;
  const double passes = opt.mode == MoeBenchMode::fwd ? 1 : opt.mode == MoeBenchMode::lora ? 2 : 3;
  const double flops = passes * 6.0 * double(T * K * P) * double(D) * double(F);
  r.tokens_per_s = double(T * P) / r.seconds;
  r.isa = std::string(cpu_isa_name(cpu_isa()));
  r.grouped = ExpertPacks::applies(experts);
  const ExpertPackStats packs = experts.packs().stats();
  r.packs = packs.packs;
  r.pack_bytes = packs.bytes;
  r.pack_s = packs.seconds;
  r.tflops = flops / r.seconds / 1e12;
  return r;
}

}  // namespace tiermoe
