#include "tiermoe/moe/kernel_bench.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <sstream>
#include <string_view>

#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/kernels/cpu_peak.h"
#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/expert_kernels.h"
#include "tiermoe/moe/expert_math.h"

namespace tiermoe {

std::string ExpertKernelBenchResult::to_json() const {
  std::ostringstream os;
  os << "{\"isa\": \"" << isa << "\", \"dtype\": \"" << dtype << "\", \"weights\": \"" << weights
     << "\", \"threads\": " << threads
     << ", \"peak_tflops\": " << peak_tflops << ", \"read_gbps\": " << read_gbps
     << ", \"pack_s\": " << pack_s
     << ", \"repack_s\": " << repack_s << ", \"pack_bytes\": " << pack_bytes << ", \"kernels\": [";
  for (size_t i = 0; i < timings.size(); ++i) {
    const ExpertKernelTiming& t = timings[i];
    os << (i ? ", " : "") << "{\"kernel\": \"" << t.kernel
       << "\", \"rows_per_expert\": " << t.rows_per_expert << ", \"experts\": " << t.experts
       << ", \"seconds\": " << t.seconds << ", \"tflops\": " << t.tflops
       << ", \"of_peak\": " << t.of_peak << ", \"bytes\": " << t.bytes
       << ", \"roofline_tflops\": " << t.roofline_tflops << ", \"of_roofline\": " << t.of_roofline
       << "}";
  }
  os << "]}";
  return os.str();
}

std::string ExpertKernelBenchResult::to_table() const {
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line,
                "ISA %s, %s products over %s weights, %d threads, measured peak %.3f TFLOP/s, "
                "memory read %.1f GB/s\n",
                isa.c_str(), dtype.c_str(), weights.c_str(), threads, peak_tflops, read_gbps);
  os << line;
  std::snprintf(line, sizeof line, "%-8s %8s %8s %10s %9s %8s %9s %8s\n", "kernel", "rows/exp",
                "experts", "seconds", "TFLOP/s", "of peak", "roofline", "of roof");
  os << line;
  for (const ExpertKernelTiming& t : timings) {
    std::snprintf(line, sizeof line, "%-8s %8lld %8lld %10.5f %9.4f %7.1f%% %9.4f %7.1f%%\n",
                  t.kernel.c_str(), (long long)t.rows_per_expert, (long long)t.experts, t.seconds,
                  t.tflops, 100 * t.of_peak, t.roofline_tflops, 100 * t.of_roofline);
    os << line;
  }
  if (weights == dtype) {
    std::snprintf(line, sizeof line,
                  "packing all four stacks: %.3f s the first time, %.3f s again; %.1f MB held\n",
                  pack_s, repack_s, double(pack_bytes) / 1e6);
  } else {
    std::snprintf(line, sizeof line,
                  "%s weights: %.1f MB stored, expanded panel by panel (no packed copies)\n",
                  weights.c_str(), double(pack_bytes) / 1e6);
  }
  os << line;
  return os.str();
}

namespace {

// The experts' matrices in a stored format: int4/int8 quantized from the
// weights, mxfp4 and fp8 random codes of the format (their speed does not
// depend on the values; fp8's NaN codes left out).
std::vector<QuantMatrix> stored_as(const GroupedExperts& experts, bool w13,
                                   const ExpertKernelBenchOptions& opt, Rng& rng) {
  std::vector<QuantMatrix> out;
  const QuantFormat f = *opt.quant;
  for (int64_t e = 0; e < experts.config().num_experts; ++e) {
    const Tensor w = w13 ? experts.weights(e).w13_FD : experts.weights(e).w2_DF;
    if (f == QuantFormat::int4 || f == QuantFormat::int8) {
      out.push_back(quantize_int(w, f, opt.group));
      continue;
    }
    const int64_t rows = w.size(0), cols = w.size(1);
    const bool mx = f == QuantFormat::mxfp4;
    QuantMatrix q;
    q.format = f, q.rows = rows, q.cols = cols, q.group = mx ? 32 : 128;
    q.code_stride = mx ? (cols + 1) / 2 : cols;
    q.scale_stride = q.scale_cols();
    Tensor codes = Tensor::empty({(rows * q.code_stride + 3) / 4}, DType::f32, MemTag::weights);
    Tensor scales = Tensor::empty({q.scale_rows() * q.scale_stride}, DType::f32, MemTag::weights);
    auto* c = static_cast<uint8_t*>(codes.raw());
    for (int64_t i = 0; i < rows * q.code_stride; ++i) {
      c[i] = uint8_t(rng.below(256));
      if (!mx && (c[i] & 0x7f) == 0x7f) c[i] &= 0xfe;
    }
    auto* sc = static_cast<uint8_t*>(scales.raw());
    for (int64_t i = 0; i < q.scale_rows() * q.scale_stride; ++i) {
      if (mx) sc[i] = uint8_t(120 + rng.below(4));
      else static_cast<float*>(scales.raw())[i] = float(rng.uniform(1e-4, 1e-3));
    }
    q.codes = c, q.scales = sc;
    q.owner = std::make_shared<std::pair<Tensor, Tensor>>(codes, scales);
    out.push_back(q);
  }
  return out;
}

}  // namespace

ExpertKernelBenchResult run_expert_kernel_bench(const ExpertKernelBenchOptions& opt) {
  TIERMOE_CHECK(opt.experts >= 1 && opt.hidden >= 1 && opt.ffn >= 1 && opt.iters >= 1 &&
                    opt.max_rows >= 1,
                "bench expert-kernels needs E, D, F, iters and max rows >= 1",
                "bench expert-kernels", "");
  for (int64_t r : opt.rows_per_expert) {
    TIERMOE_CHECK(r >= 1, detail::str_of("rows per expert must be >= 1, got ", r), "--rows", "");
  }
  if (opt.threads > 0) set_num_threads(opt.threads);
  const int64_t E = opt.experts, D = opt.hidden, F = opt.ffn;
  ExpertsConfig cfg;
  cfg.num_experts = E, cfg.hidden = D, cfg.ffn = F;
  GroupedExperts experts(cfg, opt.dtype, "bench.experts");
  TIERMOE_CHECK(ExpertPacks::applies(experts),
                detail::str_of("the grouped kernels do not run ", dtype_name(opt.dtype), " on ",
                               cpu_isa_name(cpu_isa())),
                "bench expert-kernels", "use bf16 or f32 on a TierMoE ISA (not onednn)");
  Rng rng(opt.seed);
  fill_uniform(experts.param("w13"), rng, -0.03, 0.03);
  fill_uniform(experts.param("w2"), rng, -0.03, 0.03);

  ExpertKernelBenchResult res;
  res.isa = std::string(cpu_isa_name(cpu_isa()));
  res.dtype = std::string(dtype_name(opt.dtype));
  res.threads = num_threads();
  res.peak_tflops = measure_peak_flops(cpu_isa(), opt.dtype, res.threads) / 1e12;
  res.read_gbps = measure_read_bandwidth(res.threads) / 1e9;
  res.weights = res.dtype;
  ExpertPacks& packs = experts.packs();
  // Quantized: the four products read the stored matrices through their
  // own PackedWeights; otherwise the experts' packs.
  PackedWeights stored[4];
  int64_t stored_bytes = 0;
  if (opt.quant) {
    const QuantFormat f = *opt.quant;
    const bool ints = f == QuantFormat::int4 || f == QuantFormat::int8;
    res.weights = std::string(quant_format_name(f)) + (ints ? detail::str_of(" g", opt.group) : "");
    std::vector<QuantMatrix> q13 = stored_as(experts, true, opt, rng);
    std::vector<QuantMatrix> q2 = stored_as(experts, false, opt, rng);
    for (const QuantMatrix& q : q13) stored_bytes += q.bytes();
    for (const QuantMatrix& q : q2) stored_bytes += q.bytes();
    stored[int(ExpertPack::w13_glu)].bind_quantized(q13, opt.dtype, PackUse::forward_glu);
    stored[int(ExpertPack::w2)].bind_quantized(q2, opt.dtype, PackUse::forward);
    stored[int(ExpertPack::w13_dx)].bind_quantized(q13, opt.dtype, PackUse::backward_dx);
    stored[int(ExpertPack::w2_dx)].bind_quantized(q2, opt.dtype, PackUse::backward_dx);
  }
  auto weights = [&](ExpertPack p) -> const PackedWeights& {
    return opt.quant ? stored[int(p)] : packs.get(experts, p);
  };
  auto pack_all = [&] {
    for (ExpertPack p :
         {ExpertPack::w13_glu, ExpertPack::w2, ExpertPack::w13_dx, ExpertPack::w2_dx}) {
      packs.get(experts, p);
    }
  };
  if (opt.quant) {
    res.pack_bytes = stored_bytes;
  } else {
    pack_all();
    res.pack_s = packs.stats().seconds;
    res.pack_bytes = packs.stats().bytes;
    experts.weights_changed();  // the re-pack reuses the buffers: no page faults
    pack_all();
    res.repack_s = packs.stats().seconds - res.pack_s;
  }

  using Clock = std::chrono::steady_clock;
  for (int64_t r : opt.rows_per_expert) {
    const int64_t G = std::clamp<int64_t>(opt.max_rows / r, 1, E), N = G * r;
    std::vector<int64_t> offset_E(size_t(E) + 1, N);
    for (int64_t e = 0; e <= G; ++e) offset_E[size_t(e)] = e * r;
    Tensor x = Tensor::empty({N, D}, opt.dtype), dy = Tensor::empty({N, D}, opt.dtype);
    fill_uniform(x, rng, -1, 1);
    fill_uniform(dy, rng, -1, 1);
    Tensor h = Tensor::empty({N, 2 * F}, opt.dtype), a = Tensor::empty({N, F}, opt.dtype);
    Tensor as = Tensor::empty({N, F}, opt.dtype), y = Tensor::empty({N, D}, opt.dtype);
    Tensor da = Tensor::empty({N, F}, opt.dtype), dx = Tensor::empty({N, D}, opt.dtype);
    Tensor dh_all = Tensor::empty({N, 2 * F}, opt.dtype);
    Tensor score = Tensor::empty({N}, DType::f32);
    score.fill(0.5);
    const Tensor none;
    struct Kernel {
      const char* name;
      double flops;
      double bytes;  // weights (or their gradients) once, activation rows once
      std::function<void()> run;
    };
    const double mnk = 2.0 * double(N) * double(D) * double(F);
    const double sz = double(dtype_size(opt.dtype)), gsz = double(dtype_size(experts.grad_dtype()));
    const double w2_bytes = opt.quant ? double(G) * double(quant_bytes(*opt.quant, D, F, opt.group))
                                      : double(G) * double(D) * double(F) * sz;
    const double w13_bytes = opt.quant
                                 ? double(G) * double(quant_bytes(*opt.quant, 2 * F, D, opt.group))
                                 : 2 * w2_bytes;
    const double row_D = double(N) * double(D) * sz, row_F = double(N) * double(F) * sz;
    // The weight gradients as a full fine-tuning backward computes them: per
    // expert, spread over the cores expert by expert (for_each_expert), each
    // a sum over its rows in the tier's row blocks (moe/expert_math.h) into a
    // scratch sum, as moe/expert_kernels.h does. The W13 side includes the
    // SwiGLU backward that makes dh (elementwise, no flops counted).
    auto rows = [&](const Tensor& t, int64_t e) {
      return t.rows(offset_E[size_t(e)], offset_E[size_t(e) + 1]);
    };
    auto weight_grads = [&](bool w13) {
      for_each_expert(offset_E, [&](int64_t e) {
        ExpertGrads sum = ExpertGrads::empty(cfg, experts.grad_dtype());
        ExpertRowsActs acts;
        acts.x_MD = rows(x, e), acts.h_M2F = rows(h, e), acts.a_MF = rows(a, e);
        Tensor no_dscore;
        if (w13) {
          Tensor dh = rows(dh_all, e), da_e = rows(da, e);
          expert_backward_w13_side(experts.math_without_matrices(e), dh, no_dscore, da_e, acts, none, &sum, false);
        } else {
          expert_backward_w2_side(experts.math_without_matrices(e), no_dscore, rows(dy, e), acts, none, &sum, false,
                                  false);
        }
      });
    };
    const Kernel kernels[] = {
        {"w13_glu", 2 * mnk, w13_bytes + row_D + 4 * row_F,  // x in; h, a, a' out
         [&] {
           cpu::grouped_glu_forward(h, a, as, x, offset_E, weights(ExpertPack::w13_glu), none,
                                    score);
         }},
        {"w2", mnk, w2_bytes + row_F + row_D,
         [&] { cpu::grouped_matmul(y, as, offset_E, weights(ExpertPack::w2)); }},
        {"w2_dx", mnk, w2_bytes + row_D + row_F,
         [&] { cpu::grouped_matmul(da, dy, offset_E, weights(ExpertPack::w2_dx)); }},
        {"w13_dx", 2 * mnk, w13_bytes + 2 * row_F + row_D,
         [&] { cpu::grouped_matmul(dx, h, offset_E, weights(ExpertPack::w13_dx)); }},
        // the sums in the grad dtype; dw13 reads x, h and da and writes dh
        {"dw2", mnk, w2_bytes / sz * gsz + row_F + row_D, [&] { weight_grads(false); }},
        {"dw13", 2 * mnk, w13_bytes / sz * gsz + row_D + 5 * row_F, [&] { weight_grads(true); }},
    };
    for (const Kernel& k : kernels) {
      // Quantized weights are frozen: no weight gradients (dw2, dw13).
      if (opt.quant && std::string_view(k.name).starts_with("dw")) continue;
      k.run();  // warm-up: scratch, caches
      std::vector<double> times;
      for (int it = 0; it < opt.iters; ++it) {
        const auto t0 = Clock::now();
        k.run();
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      ExpertKernelTiming t;
      t.kernel = k.name;
      t.rows_per_expert = r;
      t.experts = G;
      t.seconds = times[times.size() / 2];
      t.tflops = k.flops / t.seconds / 1e12;
      t.bytes = k.bytes;
      res.timings.push_back(t);
    }
  }
  // Neighbours on a shared host slow a whole stretch of the run: the peak is
  // measured again at the end and the higher of the two kept, so no kernel
  // is set against a peak measured in a slow stretch.
  res.peak_tflops =
      std::max(res.peak_tflops, measure_peak_flops(cpu_isa(), opt.dtype, res.threads) / 1e12);
  res.read_gbps = std::max(res.read_gbps, measure_read_bandwidth(res.threads) / 1e9);
  for (ExpertKernelTiming& t : res.timings) {
    t.of_peak = res.peak_tflops > 0 ? t.tflops / res.peak_tflops : 0;
    const double flops = t.tflops * t.seconds * 1e12;
    t.roofline_tflops =
        roofline_flops(res.peak_tflops * 1e12, res.read_gbps * 1e9, flops, t.bytes) / 1e12;
    t.of_roofline = t.roofline_tflops > 0 ? t.tflops / t.roofline_tflops : 0;
  }
  return res;
}

}  // namespace tiermoe
