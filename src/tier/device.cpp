#include "tiermoe/tier/device.h"

namespace tiermoe {

std::string_view buffer_usage_name(BufferUsage u) {
  switch (u) {
    case BufferUsage::weights: return "weights";
    case BufferUsage::grads: return "grads";
    case BufferUsage::activations: return "activations";
    case BufferUsage::workspace: return "workspace";
  }
  __builtin_unreachable();
}

void DeviceLedger::count(Op op, size_t bytes, std::string_view graph, double seconds) {
  switch (op) {
    case Op::upload:
      ++counters_.uploads;
      counters_.bytes_up += bytes;
      counters_.transfer_s += seconds;
      return;
    case Op::download:
      ++counters_.downloads;
      counters_.bytes_down += bytes;
      counters_.transfer_s += seconds;
      return;
    case Op::zero:
      counters_.transfer_s += seconds;
      return;
    case Op::launch:
      ++counters_.launches;
      ++counters_.calls[std::string(graph)];
      counters_.compute_s += seconds;
      return;
  }
}

std::string_view graph_kind_name(GraphKind k) {
  switch (k) {
    case GraphKind::expert_fwd: return "expert_fwd";
    case GraphKind::expert_bwd_dx: return "expert_bwd_dx";
    case GraphKind::expert_bwd_dx_dw: return "expert_bwd_dx_dw";
  }
  __builtin_unreachable();
}

std::string GraphKey::str() const {
  return detail::str_of(graph_kind_name(kind), " D", D, " F", F, " G", G, " ", dtype_name(dtype),
                        " ", expert_activation_name(activation), absorb ? " absorb" : "",
                        bias ? " bias" : "",
                        activation == ExpertActivation::gpt_oss
                            ? detail::str_of(" alpha ", gpt_oss.alpha, " limit ", gpt_oss.limit)
                            : std::string(),
                        quant ? " " + quant->str() : std::string());
}

const DeviceTensor* GraphArgs::find(std::string_view name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

namespace {

void check_window(const DeviceTensor& d, const Tensor& h, const char* op) {
  TIERMOE_CHECK(h.dtype() == d.dtype && h.nbytes() <= d.nbytes() &&
                    d.offset + d.nbytes() <= d.buffer.bytes,
                detail::str_of(op, ": host ", h.str(), " does not fit the device window ",
                               dtype_name(d.dtype), " of ", d.nbytes(), " bytes at offset ",
                               d.offset, " of a ", d.buffer.bytes, "-byte buffer"),
                "device", "transfers need the same dtype and at most the window's bytes");
}

}  // namespace

void upload_tensor(Device& dev, const DeviceTensor& dst, const Tensor& src) {
  check_window(dst, src, "upload");
  dev.upload(dst.buffer, dst.offset, src.raw(), src.nbytes());
}

void download_tensor(Device& dev, Tensor& dst, const DeviceTensor& src) {
  check_window(src, dst, "download");
  dev.download(dst.raw(), src.buffer, src.offset, dst.nbytes());
}

}  // namespace tiermoe
