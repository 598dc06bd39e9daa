// tiermoe bench gated-delta: the gated delta rule (kernels/gated_delta.h),
// cpu:: forward and backward, at a Qwen3.5-MoE preset's linear-attention
// shape, beside the f32 multiply-add peak measured in the same run (the
// rule's state and products are f32 whatever the inputs' dtype). Rates count
// the recurrence's own work, so that any form of it compares: 7 Dk Dv
// FLOPs a token and value head forward (decay, S^T k, the write, S^T q) and
// 13 Dk Dv backward. --json prints one object on the last line.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "flag_bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/kernels/cpu_isa.h"
#include "tiermoe/kernels/cpu_peak.h"
#include "tiermoe/kernels/gated_delta.h"

namespace tiermoe::cli {

namespace {

struct BenchGatedDeltaOptions {
  std::string preset = "qwen3.5-35b-a3b", dtype = "bf16";
  int64_t batch = 2, seq_len = 1024;
  int iters = 3, threads = 0;
  bool json = false;
};

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_bench_gated_delta(const BenchGatedDeltaOptions& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  const ModelConfig c = preset(o.preset, std::nullopt);
  TIERMOE_CHECK(c.linear_num_value_heads > 0, "preset '" + o.preset + "' has no Gated DeltaNet",
                "--preset", "pick a Qwen3.5-MoE preset (qwen3.5-35b-a3b)");
  const DType dt = parse_dtype(o.dtype), sd = dt == DType::f64 ? DType::f64 : DType::f32;
  const int64_t B = o.batch, T = o.seq_len, Hk = c.linear_num_key_heads;
  const int64_t Dk = c.linear_key_head_dim, Hv = c.linear_num_value_heads;
  const int64_t Dv = c.linear_value_head_dim;
  Rng rng(1);
  // q and k of unit length (Dk^-0.5 on q, as the layer gives them), a decay
  // and a write strength in their ranges.
  auto tensor = [&](Shape shape, DType type, double lo, double hi) {
    Tensor t = Tensor::empty(std::move(shape), type);
    fill_uniform(t, rng, lo, hi);
    return t;
  };
  const double unit = 1.0 / double(Dk);
  const Tensor q = tensor({B, T, Hk, Dk}, dt, -unit, unit), k = tensor({B, T, Hk, Dk}, dt, -1, 1);
  const Tensor v = tensor({B, T, Hv, Dv}, dt, -1, 1), dout = tensor({B, T, Hv, Dv}, dt, -1, 1);
  // g as Qwen3.5's initialisation makes it, -exp(A_log) softplus(a + dt_bias)
  // with exp(A_log) ~ U(0.01, 16) a head and dt_bias 1: some heads forget
  // within a few tokens (their decays underflow), others keep their state.
  Tensor g = Tensor::empty({B, T, Hv}, sd);
  std::vector<double> rate(static_cast<size_t>(Hv));
  for (double& r : rate) r = 0.01 + 15.99 * rng.uniform();
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double a = 1.0 + 4.0 * (rng.uniform() - 0.5);
    g.set(i, -rate[size_t(i % Hv)] * std::log1p(std::exp(a)));
  }
  const Tensor beta = tensor({B, T, Hv}, sd, 0.1, 0.9);
  Tensor out = Tensor::empty(v.shape(), dt), dq = Tensor::empty(q.shape(), dt);
  Tensor dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
  Tensor dg = Tensor::empty(g.shape(), sd), dbeta = Tensor::empty(beta.shape(), sd);
  std::vector<double> fwd, bwd;
  for (int i = 0; i <= o.iters; ++i) {  // the first of each untimed
    const double f = seconds_of([&] { cpu::gated_delta_forward(out, q, k, v, g, beta); });
    const double b = seconds_of(
        [&] { cpu::gated_delta_backward(dq, dk, dv, dg, dbeta, dout, q, k, v, g, beta); });
    if (i > 0) fwd.push_back(f), bwd.push_back(b);
  }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  const double peak = measure_peak_flops(cpu_isa(), DType::f32, num_threads());
  const double work = double(B * T * Hv) * double(Dk * Dv);
  const double f = median(fwd), b = median(bwd);
  nlohmann::json j = {{"preset", o.preset},
                      {"dtype", o.dtype},
                      {"batch", B},
                      {"seq_len", T},
                      {"threads", num_threads()},
                      {"forward_s", f},
                      {"backward_s", b},
                      {"forward_flops", 7 * work / f},
                      {"backward_flops", 13 * work / b},
                      {"f32_peak_flops", peak}};
  std::cout << "gated delta rule, " << o.preset << " (" << Hk << " key heads, " << Hv
            << " value heads of " << Dk << " x " << Dv << "), B " << B << " x T " << T << ", "
            << o.dtype << ", " << num_threads() << " threads\n"
            << "  forward   " << f << " s  " << 7 * work / f * 1e-9 << " GFLOP/s  "
            << 100 * 7 * work / f / peak << "% of the f32 peak\n"
            << "  backward  " << b << " s  " << 13 * work / b * 1e-9 << " GFLOP/s  "
            << 100 * 13 * work / b / peak << "% (f32 peak " << peak * 1e-9 << " GFLOP/s)\n";
  if (o.json) std::cout << j.dump() << "\n";
}

}  // namespace

void add_bench_gated_delta(CLI::App* bench) {
  auto o = std::make_shared<BenchGatedDeltaOptions>();
  CLI::App* p = bench->add_subcommand(
      "gated-delta", "The gated delta rule's forward and backward at a Qwen3.5-MoE preset's shape");
  p->fallthrough();
  p->add_option("--preset", o->preset, "Qwen3.5-MoE preset giving the heads")
      ->capture_default_str();
  p->add_option("--dtype", o->dtype, "bf16, f32 or f64 inputs")->capture_default_str();
  p->add_option("--batch", o->batch, "Rows B")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  p->add_option("--seq-len", o->seq_len, "Tokens T a row")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  p->add_option("--iters", o->iters, "Timed iterations (the median is reported)")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  p->add_option("--threads", o->threads, "Threads (0: all cores)")
      ->capture_default_str()
      ->check(count_in(0, max_threads(), "4 x the cores: more only oversubscribe them"));
  p->add_flag("--json", o->json, "Print one JSON object on stdout");
  p->callback([o] { run_bench_gated_delta(*o); });
}

}  // namespace tiermoe::cli
