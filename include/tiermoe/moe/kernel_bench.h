#pragma once
// The grouped expert kernels (moe/expert_kernels.h) and the weight
// gradients beside them timed one by one, for
// `tiermoe bench expert-kernels`: at a preset's expert shapes, for several
// rows per expert, each kernel's TFLOP/s beside the multiply-add peak of the
// ISA and the memory read bandwidth measured in the same run
// (kernels/cpu_peak.h), and as a share of its roofline, min(peak, bandwidth x
// flops / bytes). A kernel's bytes are its weights (or weight gradients)
// once and the activation rows it reads and writes once: what it must move
// at the least. The weights are packed before timing; packing is reported
// on its own.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tiermoe/core/dtype.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {

struct ExpertKernelBenchOptions {
  int64_t experts = 128, hidden = 2048, ffn = 768;
  DType dtype = DType::bf16;
  std::vector<int64_t> rows_per_expert = {1, 16, 64, 256, 1024};
  // Experts per case: all of them, or fewer so that a case holds at most
  // this many rows (the large cases stay seconds, not minutes).
  int64_t max_rows = 8192;
  // Frozen weights stored quantized (kernels/quant.h) instead of in dtype:
  // the four products only (no weight gradients), int4/int8 with `group`
  // columns per scale, mxfp4 and fp8 with random codes of their format.
  std::optional<QuantFormat> quant;
  int64_t group = 128;
  int iters = 3;    // timed calls per kernel (the median is reported)
  int threads = 0;  // 0: the process default
  uint64_t seed = 0;
};

struct ExpertKernelTiming {
  // w13_glu (fused W13 + activation + score), w2, w2_dx, w13_dx; dw2 and dw13
  // (the weight gradients, per expert as full fine-tuning runs them)
  std::string kernel;
  int64_t rows_per_expert = 0, experts = 0;
  double seconds = 0, tflops = 0;
  double of_peak = 0;  // tflops / peak (0 when no peak was measured)
  double bytes = 0;    // the least it moves: weights once, activation rows once
  double roofline_tflops = 0;  // min(peak, bandwidth x flops / bytes)
  double of_roofline = 0;      // tflops / roofline
};

struct ExpertKernelBenchResult {
  std::string isa, dtype;
  std::string weights;  // "bf16", or the stored format: "int4 g128", "mxfp4"
  int threads = 0;
  double peak_tflops = 0;  // measured before and after the kernels, the higher; 0 on emulated ISAs
  double read_gbps = 0;    // memory read bandwidth, GB/s, measured likewise
  double pack_s = 0;       // packing all four stacks once (first touch of the buffers included)
  double repack_s = 0;     // packing them again, as full fine-tuning does after each step
  int64_t pack_bytes = 0;  // packed copies held (quantized: the stored bytes, no copies)
  std::vector<ExpertKernelTiming> timings;
  std::string to_json() const;
  std::string to_table() const;
};

ExpertKernelBenchResult run_expert_kernel_bench(const ExpertKernelBenchOptions& opt);

}  // namespace tiermoe
