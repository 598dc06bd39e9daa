#include "tiermoe/model/memory_estimate.h"

#include <algorithm>
#include <cstdint>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {

using detail::str_of;

uint64_t HostMemoryEstimate::total() const {
  uint64_t sum = 0;
  for (uint64_t part : {weights, grads, optimizer, activations}) {
    if (__builtin_add_overflow(sum, part, &sum)) return UINT64_MAX;
  }
  return sum;
}

std::string HostMemoryEstimate::breakdown() const {
  std::string s = "weights " + format_size(weights);
  if (grads) s += " + gradients " + format_size(grads);
  if (optimizer) s += " + optimizer state " + format_size(optimizer);
  if (activations) s += " + activations " + format_size(activations);
  return s;
}

double stored_expert_bytes_per_param(const ModelConfig& c) {
  // Code bits, and a scale per `area` elements.
  auto per_param = [](QuantFormat f, int64_t area) {
    return quant_code_bits(f) / 8.0 + double(quant_scale_bytes(f)) / double(area);
  };
  if (c.quant_method == "mxfp4") return per_param(QuantFormat::mxfp4, 32);
  if (c.quant_method == "fp8") return per_param(QuantFormat::fp8, 128 * 128);
  if (c.quant_method == "compressed-tensors" && (c.quant_bits == 4 || c.quant_bits == 8)) {
    const QuantFormat f = c.quant_bits == 4 ? QuantFormat::int4 : QuantFormat::int8;
    return c.quant_group > 0 ? per_param(f, c.quant_group) : quant_code_bits(f) / 8.0;
  }
  return 0;
}

HostMemoryEstimate estimate_host_memory(const ModelConfig& c, const RunMemoryShape& run,
                                        const std::string& where) {
  auto mul = [&](std::initializer_list<int64_t> f) {
    return checked_product(f, "the memory the run needs", where);
  };
  const ParamCounts n = param_counts(c, where);
  // Expert parallel ranks hold only their share of the experts.
  const int64_t params = n.total - n.experts + n.experts / std::max(run.ranks, 1);
  const int64_t value = int64_t(dtype_size(run.dtype));
  // Gradients and masters accumulate in f32 (f64 in f64 runs).
  const int64_t acc = run.dtype == DType::f64 ? 8 : 4;

  HostMemoryEstimate e;
  e.weights = run.weights_mapped ? 0 : uint64_t(mul({params, value}));
  // Routed experts a checkpoint ships at low width stay at it in runs that
  // train none of them (io/stored_quant.h): codes and f32 scales.
  const int64_t local_experts = n.experts / std::max(run.ranks, 1);
  const double stored = stored_expert_bytes_per_param(c);
  if (!run.weights_mapped && stored > 0 && !run.full_ft && run.dtype != DType::f64) {
    e.weights -= uint64_t(mul({local_experts, value}));
    e.weights += uint64_t(double(local_experts) * stored);
  }
  if (run.full_ft) {
    e.grads = uint64_t(mul({params, acc}));
    const int64_t masters = run.optimizer_states + (run.dtype == DType::bf16 ? 1 : 0);
    e.optimizer = uint64_t(mul({params, masters, acc}));
  }
  const int64_t tokens = std::max<int64_t>(run.tokens, 0);
  // The residual stream: one [tokens, D] per layer kept for backward, or the
  // two a forward alternates between.
  const int64_t streams = run.backward ? c.num_hidden_layers : 2;
  const int64_t chunk = run.lm_head_chunk > 0 ? std::min(run.lm_head_chunk, tokens) : tokens;
  e.activations =
      uint64_t(checked_add(mul({tokens, c.hidden_size, streams, value}),
                           mul({chunk, c.vocab_size, value}), "the memory the run needs", where));
  return e;
}

void check_host_memory_for(const ModelConfig& config, const RunMemoryShape& run,
                           const std::string& model, const std::string& batch,
                           const std::string& hint) {
  const HostMemoryEstimate e = estimate_host_memory(config, run, batch);
  // Name what is too large: the batch when its activations are most of it.
  const std::string& where = e.activations > e.total() / 2 ? batch : model;
  check_host_memory(e.total(), str_of("the run (", e.breakdown(), ")"), where, hint);
}

}  // namespace tiermoe
