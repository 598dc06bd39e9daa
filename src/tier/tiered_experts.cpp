#include "tiermoe/tier/tiered_experts.h"

#include <algorithm>
#include <exception>

#include "tiermoe/core/parallel.h"
#include "tiermoe/core/timer.h"

namespace tiermoe {

namespace {

std::vector<uint8_t> complement(const std::vector<uint8_t>& on) {
  std::vector<uint8_t> out(on.size());
  for (size_t i = 0; i < on.size(); ++i) out[i] = !on[i];
  return out;
}

// Work queued on the device reads and writes host buffers until it has run:
// if the host side throws before the sync, wait for that work before the
// buffers go away (its own failure, if any, is moot by then).
class DrainOnUnwind {
 public:
  explicit DrainOnUnwind(Device& d) : device_(&d) {}
  ~DrainOnUnwind() {
    if (!std::uncaught_exceptions()) return;
    try {
      device_->sync();
    } catch (...) {
    }
  }

 private:
  Device* device_;
};

}  // namespace

// One expert's parameter-shaped tensors (w13, w2 [, b13, b2]) packed in one
// device buffer, as bytes_resident (cost_model.h) counts them: its weights,
// or in full fine-tuning its weight-gradient sums.
struct TieredExperts::ExpertBlock {
  DeviceBuffer buffer;
  DeviceTensor w13_FD, w2_DF, b13_F, b2_D;
  DeviceTensor w13_q, w2_q;  // instead of w13_FD, w2_DF: quantized images (held_quant())
};

// A resident expert's device memory: its weights, and with weight grads the
// per-call gradient sums (moe/expert_math.h's rule, continued launch by launch).
struct TieredExperts::Resident {
  ExpertBlock weights, sums;
};

TieredExperts::ExpertBlock TieredExperts::alloc_block(DType dt, BufferUsage usage,
                                                      const std::string& what) {
  const ExpertsConfig& cfg = experts_->config();
  const int64_t D = cfg.hidden, F = cfg.ffn;
  // Weights of quantized experts are their images; gradient sums never are.
  const std::optional<ExpertQuant> quant =
      usage == BufferUsage::weights ? held_quant() : std::nullopt;
  ExpertBlock b;
  size_t offset = 0;
  auto next = [&](Shape shape, DType t) {
    DeviceTensor d{DeviceBuffer{}, offset, std::move(shape), t};
    offset += d.nbytes();
    return d;
  };
  if (quant) {
    b.w13_q = next({quant_image(quant->w13, 2 * F, D).words()}, DType::f32);
    b.w2_q = next({quant_image(quant->w2, D, F).words()}, DType::f32);
  } else {
    b.w13_FD = next({2 * F, D}, dt);
    b.w2_DF = next({D, F}, dt);
  }
  if (cfg.bias) {
    b.b13_F = next({2 * F}, dt);
    b.b2_D = next({D}, dt);
  }
  b.buffer = device_->alloc(offset, usage, what);
  for (DeviceTensor* t : {&b.w13_FD, &b.w2_DF, &b.b13_F, &b.b2_D, &b.w13_q, &b.w2_q}) {
    if (!t->shape.empty()) t->buffer = b.buffer;  // the block's parts, not the absent ones
  }
  return b;
}

void TieredExperts::free_block(ExpertBlock& b) {
  if (b.buffer.valid()) device_->free(b.buffer);
  b = {};
}

TieredExperts::TieredExperts(GroupedExperts& experts, HostExperts& host, Device& device,
                             TierWorkspace& workspace, std::vector<int64_t> buckets)
    : experts_(&experts),
      host_(&host),
      device_(&device),
      ws_(&workspace),
      buckets_(std::move(buckets)),
      state_(size_t(experts.config().num_experts)) {
  TIERMOE_CHECK(!buckets_.empty() && buckets_.back() == experts.config().dw_row_block &&
                    buckets_.back() <= workspace.max_rows(),
                detail::str_of("the largest bucket must equal dw_row_block (",
                               experts.config().dw_row_block, ") and fit the workspace (",
                               workspace.max_rows(), " rows)"),
                name(), "a launch is one weight-gradient block: build the ladder with bucket_ladder");
}

TieredExperts::~TieredExperts() {
  for (auto& r : state_) {
    if (!r) continue;
    free_block(r->weights);
    free_block(r->sums);
  }
}

std::optional<ExpertQuant> TieredExperts::held_quant() const {
  return device_->holds_quantized() ? experts_->quant() : std::nullopt;
}

bool TieredExperts::device_capable() const {
  return !experts_->has_output_postprocess() && !host_->adapted().any();
}

std::vector<uint8_t> TieredExperts::resident() const {
  std::vector<uint8_t> on(state_.size());
  for (size_t e = 0; e < on.size(); ++e) on[e] = state_[e] != nullptr;
  return on;
}

int64_t TieredExperts::resident_count() const {
  return std::count_if(state_.begin(), state_.end(), [](const auto& r) { return r != nullptr; });
}

size_t TieredExperts::device_bytes() const {
  size_t n = 0;
  for (const auto& r : state_) {
    if (r) n += r->weights.buffer.bytes + r->sums.buffer.bytes;
  }
  return n;
}

size_t TieredExperts::set_resident(const std::vector<uint8_t>& resident_E, bool with_grads) {
  const ExpertsConfig& cfg = experts_->config();
  const int64_t E = cfg.num_experts;
  TIERMOE_CHECK(int64_t(resident_E.size()) == E,
                detail::str_of("a placement of ", resident_E.size(), " experts for ", E), name(),
                "plan with this layer's expert count");
  TIERMOE_CHECK(device_capable() ||
                    std::none_of(resident_E.begin(), resident_E.end(), [](uint8_t r) { return r; }),
                "these experts cannot run on the device (a LoRA adapter or a postprocess)", name(),
                "keep them on the host (--placement host)");
  TIERMOE_CHECK(!held_quant() || ws_->decodes(),
                "the device holds these experts quantized (" + held_quant()->str() +
                    "), but the tier's workspace has no room to decode them",
                name(), "make the tier with an ExpertShape carrying the experts' quant layouts");
  size_t uploaded = 0;
  for (int64_t e = 0; e < E; ++e) {
    auto& r = state_[size_t(e)];
    if (!resident_E[size_t(e)]) {
      if (r) {
        free_block(r->weights);
        free_block(r->sums);
        r.reset();
      }
      continue;
    }
    const std::string what = detail::str_of(experts_->name(), ".", e);
    if (!r) {
      auto fresh = std::make_unique<Resident>();
      fresh->weights = alloc_block(experts_->dtype(), BufferUsage::weights, what + " weights");
      upload_expert(e, fresh->weights);
      uploaded += fresh->weights.buffer.bytes;
      r = std::move(fresh);
    }
    if (with_grads && !r->sums.buffer.valid()) {
      r->sums = alloc_block(experts_->grad_dtype(), BufferUsage::grads, what + " gradient sums");
    } else if (!with_grads) {
      free_block(r->sums);
    }
  }
  device_->sync();
  return uploaded;
}

void TieredExperts::upload_expert(int64_t e, const ExpertBlock& on_device) {
  TIERMOE_CHECK(experts_->weights_bound(e),
                detail::str_of("expert ", e, "'s weights are uploaded before they were bound"),
                experts_->name(), "bind the experts' weights before the tier places any");
  if (on_device.w13_q.buffer.valid()) {
    upload_image(on_device.w13_q, experts_->quantized_w13(e));
    upload_image(on_device.w2_q, experts_->quantized_w2(e));
  }
  const bool images = on_device.w13_q.buffer.valid();
  // Quantized images carry W13 and W2; the biases come without dequantizing them.
  const ExpertWeights w = images ? experts_->math_without_matrices(e).w : experts_->weights(e);
  // Frozen experts may be stored narrower than the compute dtype (bf16 in an
  // f32 run, experts.h); the device holds them widened (exact), so its graphs
  // run the plain products the host's mixed ones equal. An upload may read
  // its source after it returns, so a widened copy is waited for before it dies.
  auto upload = [&](const DeviceTensor& dst, const Tensor& t) {
    if (t.dtype() == experts_->dtype()) {
      upload_tensor(*device_, dst, t);
      return;
    }
    const Tensor widened = t.to(experts_->dtype());
    upload_tensor(*device_, dst, widened);
    device_->sync();
  };
  if (!images) {
    upload(on_device.w13_FD, w.w13_FD);
    upload(on_device.w2_DF, w.w2_DF);
  }
  if (experts_->config().bias) {
    upload_tensor(*device_, on_device.b13_F, w.b13_F);
    upload_tensor(*device_, on_device.b2_D, w.b2_D);
  }
  // What an upload may still read dies here: quantized experts' weights(e)
  // are dequantized copies, and strided images staged ones. An image of the
  // host's own codes and scales needs no wait.
  if ((experts_->quantized() && !images) || !staged_images_.empty()) {
    device_->sync();
    staged_images_.clear();
  }
}

void TieredExperts::upload_image(const DeviceTensor& dst, const QuantMatrix& q) {
  const QuantImage im = quant_image(quant_layout(q), q.rows, q.cols);
  TIERMOE_ASSERT(size_t(im.bytes) == dst.nbytes(), "image of ", im.bytes, " bytes into ",
                 dst.nbytes());
  if (quant_rows_dense(q)) {
    // Codes and scales as the host holds them (a checkpoint's mapped pages
    // or the loader's stacks): two copies, no staging.
    device_->upload(dst.buffer, dst.offset, q.codes, size_t(im.codes_bytes));
    device_->upload(dst.buffer, dst.offset + size_t(im.scales_offset), q.scales,
                    size_t(im.scales_bytes));
    return;
  }
  staged_images_.emplace_back(size_t(im.bytes));
  write_quant_image(q, staged_images_.back().data());
  device_->upload(dst.buffer, dst.offset, staged_images_.back().data(), size_t(im.bytes));
}

size_t TieredExperts::upload_weights() {
  size_t bytes = 0;
  for (int64_t e = 0; e < num_experts(); ++e) {
    const auto& r = state_[size_t(e)];
    if (!r) continue;
    upload_expert(e, r->weights);
    bytes += r->weights.buffer.bytes;
  }
  device_->sync();
  return bytes;
}

TierLayerStats TieredExperts::take_stats() {
  TierLayerStats s = stats_;
  stats_ = {};
  return s;
}

std::vector<uint8_t> TieredExperts::device_experts(const std::vector<int64_t>& offset_E) const {
  if (host_only_ || !device_capable()) return {};
  std::vector<uint8_t> on(state_.size(), 0);
  bool any = false;
  for (size_t e = 0; e < on.size(); ++e) {
    const int64_t rows = offset_E[e + 1] - offset_E[e];
    on[e] = state_[e] && rows > 0;
    any = any || on[e];
  }
  if (!any) on.clear();
  return on;
}

GraphKey TieredExperts::key(GraphKind kind, int64_t G, bool absorb) const {
  const ExpertsConfig& cfg = experts_->config();
  GraphKey k{kind, cfg.hidden, cfg.ffn, G, experts_->dtype(), cfg.activation, absorb, cfg.bias};
  if (cfg.activation == ExpertActivation::gpt_oss) k.gpt_oss = cfg.gpt_oss;
  k.quant = held_quant();
  return k;
}

void TieredExperts::stage_rows(const DeviceTensor& slot, const Tensor& rows) {
  upload_tensor(*device_, slot, rows);
  if (rows.nbytes() < slot.nbytes()) {
    device_->zero(slot.buffer, slot.offset + rows.nbytes(), slot.nbytes() - rows.nbytes());
  }
}

void TieredExperts::run_host(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  const int before = num_threads();
  if (host_threads_ > 0) set_num_threads(host_threads_);
  try {
    fn();
  } catch (...) {
    set_num_threads(before);
    throw;
  }
  set_num_threads(before);
  stats_.host_s += seconds_since(t0);
}

bool TieredExperts::sync_device() {
  const auto t0 = Clock::now();
  try {
    device_->sync();
  } catch (const DeviceError&) {
    // The device's share of this call is redone on the host; the layer stays
    // there until the next step.
    host_only_ = true;
    ++stats_.faults;
    stats_.wait_s += seconds_since(t0);
    return false;
  }
  stats_.wait_s += seconds_since(t0);
  return true;
}

void TieredExperts::begin_counters() { before_ = device_->counters(); }

void TieredExperts::end_counters() {
  const DeviceCounters now = device_->counters();
  stats_.device_calls += now.launches - before_.launches;
  stats_.bytes_up += now.bytes_up - before_.bytes_up;
  stats_.bytes_down += now.bytes_down - before_.bytes_down;
  stats_.device_s += now.busy_s - before_.busy_s;
  stats_.transfer_s += now.transfer_s - before_.transfer_s;
}

void TieredExperts::set_weights(GraphArgs& args, const ExpertBlock& w, int64_t set) const {
  if (w.w13_q.buffer.valid()) {
    args.set("w13_q", w.w13_q).set("w2_q", w.w2_q);
    args.set("w13_FD", ws_->decoded("w13_FD", set)).set("w2_DF", ws_->decoded("w2_DF", set));
  } else {
    args.set("w13_FD", w.w13_FD).set("w2_DF", w.w2_DF);
  }
  if (experts_->config().bias) args.set("b13_F", w.b13_F).set("b2_D", w.b2_D);
}

void TieredExperts::enqueue_forward(int64_t e, Tensor* y_ND, Tensor* h_N2F, Tensor* a_NF,
                                    const Tensor& x_ND, const std::vector<int64_t>& offset_E,
                                    const Tensor& score_N) {
  const Resident& r = *state_[size_t(e)];
  const bool absorb = score_N.defined();
  const int64_t b = offset_E[size_t(e)], end = offset_E[size_t(e) + 1], Gmax = buckets_.back();
  for (int64_t c = b; c < end; c += Gmax) {
    const int64_t m = std::min(Gmax, end - c), G = bucket_for(buckets_, m);
    const Graph& graph = device_->compile(key(GraphKind::expert_fwd, G, absorb));
    const int64_t set = launches_++ % kWorkspaceSets;
    auto slot = [&](std::string_view name) { return ws_->slot(name, G, set); };
    const DeviceTensor x = slot("x_GD"), y = slot("y_GD"), h = slot("h_G2F"), a = slot("a_GF");
    stage_rows(x, x_ND.rows(c, c + m));
    GraphArgs args;
    args.set("x_GD", x).set("y_GD", y).set("h_G2F", h).set("a_GF", a);
    set_weights(args, r.weights, set);
    if (absorb) {
      const DeviceTensor s = slot("score_G");
      stage_rows(s, score_N.rows(c, c + m));
      args.set("score_G", s);
    }
    device_->launch(graph, std::move(args));
    auto fetch = [&](Tensor* dst, const DeviceTensor& src) {
      if (!dst) return;
      Tensor rows = dst->rows(c, c + m);
      download_tensor(*device_, rows, src);
    };
    fetch(y_ND, y);
    fetch(h_N2F, h);
    fetch(a_NF, a);
    stats_.padded_rows += G - m;
  }
}

void TieredExperts::enqueue_backward(int64_t e, Tensor& dx_ND, Tensor& dscore_N,
                                     const Tensor& dy_ND, const std::vector<int64_t>& offset_E,
                                     const Tensor& score_N, const SavedTensors& saved,
                                     ExpertGrads* sums_host) {
  const Resident& r = *state_[size_t(e)];
  const bool absorb = score_N.defined(), bias = experts_->config().bias;
  const GraphKind kind = sums_host ? GraphKind::expert_bwd_dx_dw : GraphKind::expert_bwd_dx;
  const int64_t b = offset_E[size_t(e)], end = offset_E[size_t(e) + 1], Gmax = buckets_.back();
  for (int64_t c = b; c < end; c += Gmax) {
    const int64_t m = std::min(Gmax, end - c), G = bucket_for(buckets_, m);
    const Graph& graph = device_->compile(key(kind, G, absorb));
    const int64_t set = launches_++ % kWorkspaceSets;
    auto slot = [&](std::string_view name) { return ws_->slot(name, G, set); };
    const DeviceTensor dy = slot("y_GD"), h = slot("h_G2F"), dx = slot("dx_GD");
    stage_rows(dy, dy_ND.rows(c, c + m));
    stage_rows(h, saved.get("h_N2F").rows(c, c + m));
    GraphArgs args;
    args.set("dy_GD", dy).set("h_G2F", h).set("dx_GD", dx);
    set_weights(args, r.weights, set);
    if (absorb || sums_host) {
      const DeviceTensor a = slot("a_GF");
      stage_rows(a, saved.get("a_NF").rows(c, c + m));
      args.set("a_GF", a);
    }
    if (absorb) {
      const DeviceTensor s = slot("score_G");
      stage_rows(s, score_N.rows(c, c + m));
      args.set("score_G", s).set("dscore_G", slot("dscore_G"));
    }
    if (sums_host) {
      const DeviceTensor x = slot("x_GD");
      stage_rows(x, saved.get("x_ND").rows(c, c + m));
      args.set("x_GD", x).set("dw13_FD", r.sums.w13_FD).set("dw2_DF", r.sums.w2_DF);
      if (bias) args.set("db13_F", r.sums.b13_F).set("db2_D", r.sums.b2_D);
      args.ints["sum_started"] = c > b;
    }
    device_->launch(graph, std::move(args));
    Tensor dx_rows = dx_ND.rows(c, c + m);
    download_tensor(*device_, dx_rows, dx);
    if (absorb) {
      Tensor ds_rows = dscore_N.rows(c, c + m);
      download_tensor(*device_, ds_rows, slot("dscore_G"));
    }
    stats_.padded_rows += G - m;
  }
  if (sums_host) {
    download_tensor(*device_, sums_host->dw13_FD, r.sums.w13_FD);
    download_tensor(*device_, sums_host->dw2_DF, r.sums.w2_DF);
    if (bias) {
      download_tensor(*device_, sums_host->db13_F, r.sums.b13_F);
      download_tensor(*device_, sums_host->db2_D, r.sums.b2_D);
    }
  }
}

void TieredExperts::forward(Tensor& y_ND, const Tensor& x_ND,
                            const std::vector<int64_t>& offset_E, const Tensor& score_N,
                            SavedTensors& saved, const ExpertSaves& keep) {
  host_->check_forward(y_ND, x_ND, offset_E, score_N);
  if (observe_) {
    std::vector<int64_t> count_E(static_cast<size_t>(num_experts()));
    for (size_t e = 0; e < count_E.size(); ++e) count_E[e] = offset_E[e + 1] - offset_E[e];
    observe_(count_E);
  }
  ExpertRowsActs all = host_->forward_buffers(saved, x_ND, keep);
  stats_.rows += x_ND.size(0);
  const std::vector<uint8_t> dev = device_experts(offset_E);
  if (dev.empty()) {
    host_->forward_experts(y_ND, all, x_ND, offset_E, score_N, {});
    return;
  }
  begin_counters();
  DrainOnUnwind drain(*device_);
  for (int64_t e = 0; e < num_experts(); ++e) {
    if (!dev[size_t(e)]) continue;
    enqueue_forward(e, &y_ND, keep.h ? &all.h_M2F : nullptr, keep.a ? &all.a_MF : nullptr, x_ND,
                    offset_E, score_N);
  }
  run_host([&] { host_->forward_experts(y_ND, all, x_ND, offset_E, score_N, dev); });
  if (sync_device()) {
    for (size_t e = 0; e < dev.size(); ++e) {
      if (dev[e]) stats_.device_rows += offset_E[e + 1] - offset_E[e];
    }
  } else {
    host_->forward_experts(y_ND, all, x_ND, offset_E, score_N, complement(dev));
  }
  end_counters();
}

void TieredExperts::replay(SavedTensors& saved, const Tensor& x_ND,
                           const std::vector<int64_t>& offset_E, const Tensor& score_N,
                           const ExpertStages& stages) {
  const std::vector<uint8_t> dev = stages.w13 ? device_experts(offset_E) : std::vector<uint8_t>{};
  if (dev.empty()) {
    // An activation-only replay is elementwise: not worth a round trip.
    host_->replay(saved, x_ND, offset_E, score_N, stages);
    return;
  }
  host_->replay_buffers(saved, x_ND, offset_E, stages);
  Tensor h_N2F = saved.get("h_N2F");
  Tensor a_NF = stages.act ? saved.get("a_NF") : Tensor();
  begin_counters();
  DrainOnUnwind drain(*device_);
  for (int64_t e = 0; e < num_experts(); ++e) {
    if (!dev[size_t(e)]) continue;
    enqueue_forward(e, nullptr, &h_N2F, stages.act ? &a_NF : nullptr, x_ND, offset_E, score_N);
  }
  run_host([&] { host_->replay_experts(saved, x_ND, offset_E, score_N, stages, dev); });
  if (!sync_device()) {
    host_->replay_experts(saved, x_ND, offset_E, score_N, stages, complement(dev));
  }
  end_counters();
}

void TieredExperts::backward(Tensor& dx_ND, Tensor& dscore_N, const Tensor& dy_ND,
                             const std::vector<int64_t>& offset_E, const Tensor& score_N,
                             const SavedTensors& saved, bool weight_grads, bool adapter_grads) {
  host_->check_backward(dx_ND, dscore_N, dy_ND, offset_E, score_N);
  std::vector<uint8_t> dev = device_experts(offset_E);
  if (weight_grads) {
    experts_->allocate_grads();
    // Experts made resident for dx only (LoRA placement) have no sums.
    for (size_t e = 0; e < dev.size(); ++e) dev[e] = dev[e] && state_[e]->sums.buffer.valid();
    if (std::none_of(dev.begin(), dev.end(), [](uint8_t d) { return d; })) dev.clear();
  }
  if (dev.empty()) {
    host_->backward_experts(dx_ND, dscore_N, dy_ND, offset_E, score_N, saved, weight_grads,
                            adapter_grads, {});
    return;
  }
  const ExpertsConfig& cfg = experts_->config();
  std::vector<ExpertGrads> sums(dev.size());
  begin_counters();
  DrainOnUnwind drain(*device_);
  for (int64_t e = 0; e < num_experts(); ++e) {
    if (!dev[size_t(e)]) continue;
    ExpertGrads* s = nullptr;
    if (weight_grads) {
      sums[size_t(e)] = ExpertGrads::empty(cfg, experts_->grad_dtype());
      s = &sums[size_t(e)];
    }
    enqueue_backward(e, dx_ND, dscore_N, dy_ND, offset_E, score_N, saved, s);
  }
  run_host([&] {
    host_->backward_experts(dx_ND, dscore_N, dy_ND, offset_E, score_N, saved, weight_grads,
                            adapter_grads, dev);
  });
  if (sync_device()) {
    // The device's sums join the accumulated grads with the host's one add.
    for (size_t e = 0; e < dev.size(); ++e) {
      if (dev[e] && weight_grads) experts_->grads(int64_t(e)).add(sums[e]);
    }
  } else {
    host_->backward_experts(dx_ND, dscore_N, dy_ND, offset_E, score_N, saved, weight_grads,
                            adapter_grads, complement(dev));
  }
  end_counters();
}

}  // namespace tiermoe
