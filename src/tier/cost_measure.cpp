// The cost model's start-up measurements (cost_model.h): the host's expert
// throughput through the same HostExperts the layers use, and a device's
// graph throughput, link rate and launch overhead through the Device
// interface only. Each runs its work once untimed first (the first GEMM of a
// process and the first launch of a graph are slow) and keeps the median of
// a few timed repeats.
#include <algorithm>
#include <vector>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/core/timer.h"
#include "tiermoe/kernels/quant_image.h"
#include "tiermoe/moe/executor.h"
#include "tiermoe/moe/saved.h"
#include "tiermoe/tier/cost_model.h"

namespace tiermoe {

namespace {

constexpr int kRepeats = 3;
constexpr double kTimedBudgetS = 0.3;
constexpr int64_t kHostExperts = 2;  // more than one: weights stream as in a real layer
constexpr int64_t kHostRows = 256;   // rows per expert
constexpr size_t kLinkBytes = size_t(4) << 20;
constexpr int64_t kTinyWidth = 16;  // D = F of the launch-overhead graph
constexpr size_t kDeviceSlack = size_t(1) << 20;

// The median of up to kRepeats timed runs, fewer once they have taken
// kTimedBudgetS (a slow host still starts up in about a second).
template <class Fn>
double median_seconds(int repeats, Fn&& fn) {
  std::vector<double> t;
  double spent = 0;
  for (int i = 0; i < repeats && (i == 0 || spent < kTimedBudgetS); ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(seconds_since(t0));
    spent += t.back();
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Sets the thread count for a scope and restores it.
class ThreadScope {
 public:
  explicit ThreadScope(int threads) : saved_(num_threads()) { set_num_threads(threads); }
  ~ThreadScope() { set_num_threads(saved_); }

 private:
  int saved_;
};

// Device buffers freed when the measurement ends, however it ends.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(Device& dev) : dev_(dev) {}
  ~DeviceBuffers() {
    for (DeviceBuffer& b : bufs_) {
      try {
        dev_.free(b);
      } catch (const std::exception&) {
        // A failed launch already surfaced through sync(); the memory is
        // released by the device either way.
      }
    }
  }
  DeviceBuffer alloc(size_t bytes, BufferUsage usage, std::string_view what) {
    bufs_.push_back(dev_.alloc(bytes, usage, what));
    return bufs_.back();
  }

 private:
  Device& dev_;
  std::vector<DeviceBuffer> bufs_;
};

// Uniform in [-scale, scale]: any finite values time the same, and uniform
// draws are cheaper than normal ones at expert sizes.
Tensor random_host(const Shape& shape, DType dtype, Rng& rng, double scale) {
  Tensor t = Tensor::empty(shape, dtype);
  fill_uniform(t, rng, -scale, scale);
  return t;
}

// One expert made resident (random weights), its gradient sums for full
// mode, and a workspace at G rows holding random inputs; the graph
// arguments of the mode's forward and backward launches.
struct StagedExpert {
  GraphArgs fwd, bwd;
  std::vector<Tensor> host;  // what was uploaded, alive until sync()
};

StagedExpert stage_expert(Device& dev, DeviceBuffers& bufs, const ExpertShape& s, TrainMode m,
                          int64_t G, Rng& rng) {
  StagedExpert st;
  auto resident = [&](const char* name, Shape shape, DType dtype, BufferUsage usage) {
    DeviceTensor t{{}, 0, shape, dtype};
    t.buffer = bufs.alloc(t.nbytes(), usage, std::string("measure ") + name);
    return t;
  };
  auto upload = [&](const DeviceTensor& dst, double scale) {
    st.host.push_back(random_host(dst.shape, dst.dtype, rng, scale));
    upload_tensor(dev, dst, st.host.back());
  };
  const WorkspaceLayout ws = workspace_layout(s, G);
  const DeviceBuffer ws_buf = bufs.alloc(ws.bytes, BufferUsage::workspace, "measure workspace");
  dev.zero(ws_buf, 0, ws.bytes);
  auto slot = [&](const char* name) { return ws.tensor(ws_buf, name); };

  std::vector<std::pair<std::string, DeviceTensor>> weights;
  if (s.quant) {
    // The images, and the workspace's scratch the graph decodes them into.
    auto image = [&](const char* name, const QuantLayout& l, int64_t rows, int64_t cols) {
      const QuantMatrix q = random_quant_matrix(l, rows, cols, rng);
      const QuantImage im = quant_image(l, rows, cols);
      const DeviceTensor t = resident(name, {im.words()}, DType::f32, BufferUsage::weights);
      st.host.push_back(Tensor::empty({im.words()}, DType::f32));
      write_quant_image(q, st.host.back().raw());
      upload_tensor(dev, t, st.host.back());
      weights.push_back({name, t});
    };
    image("w13_q", s.quant->w13, 2 * s.F, s.D);
    image("w2_q", s.quant->w2, s.D, s.F);
    weights.push_back({"w13_FD", slot("w13_FD")});
    weights.push_back({"w2_DF", slot("w2_DF")});
  } else {
    const DeviceTensor w13 = resident("w13_FD", {2 * s.F, s.D}, s.dtype, BufferUsage::weights);
    const DeviceTensor w2 = resident("w2_DF", {s.D, s.F}, s.dtype, BufferUsage::weights);
    upload(w13, 0.02);
    upload(w2, 0.02);
    weights = {{"w13_FD", w13}, {"w2_DF", w2}};
  }
  if (s.bias) {
    const DeviceTensor b13 = resident("b13_F", {2 * s.F}, s.dtype, BufferUsage::weights);
    const DeviceTensor b2 = resident("b2_D", {s.D}, s.dtype, BufferUsage::weights);
    upload(b13, 0.02);
    upload(b2, 0.02);
    weights.push_back({"b13_F", b13});
    weights.push_back({"b2_D", b2});
  }

  upload(slot("x_GD"), 1.0);
  if (s.absorb) upload(slot("score_G"), 0.5);

  st.fwd.set("x_GD", slot("x_GD"));
  for (const auto& [name, t] : weights) st.fwd.set(name, t);
  if (s.absorb) st.fwd.set("score_G", slot("score_G"));
  st.fwd.set("y_GD", slot("y_GD")).set("h_G2F", slot("h_G2F")).set("a_GF", slot("a_GF"));

  // The forward's output serves as dy: any finite values time the same.
  st.bwd.set("dy_GD", slot("y_GD")).set("h_G2F", slot("h_G2F"));
  for (const auto& [name, t] : weights) st.bwd.set(name, t);
  if (s.absorb || m == TrainMode::full) st.bwd.set("a_GF", slot("a_GF"));
  if (s.absorb) st.bwd.set("score_G", slot("score_G")).set("dscore_G", slot("dscore_G"));
  st.bwd.set("dx_GD", slot("dx_GD"));
  if (m == TrainMode::full) {
    st.bwd.set("x_GD", slot("x_GD"));
    const DType gt = s.grad_dtype();
    st.bwd.set("dw13_FD", resident("dw13_FD", {2 * s.F, s.D}, gt, BufferUsage::grads));
    st.bwd.set("dw2_DF", resident("dw2_DF", {s.D, s.F}, gt, BufferUsage::grads));
    if (s.bias) {
      st.bwd.set("db13_F", resident("db13_F", {2 * s.F}, gt, BufferUsage::grads));
      st.bwd.set("db2_D", resident("db2_D", {s.D}, gt, BufferUsage::grads));
    }
    st.bwd.ints["sum_started"] = 0;
  }
  dev.sync();
  return st;
}

ExpertShape tiny_shape(const ExpertShape& s) {
  ExpertShape t = s;
  t.D = t.F = kTinyWidth;
  return t;
}

}  // namespace

double measure_host(const ExpertShape& s, TrainMode m, int threads) {
  ThreadScope scope(std::max(threads, 1));
  ExpertsConfig cfg;
  cfg.num_experts = kHostExperts;
  cfg.hidden = s.D;
  cfg.ffn = s.F;
  cfg.activation = s.activation;
  cfg.bias = s.bias;
  GroupedExperts experts(cfg, s.dtype, "measure_host");
  Rng rng(1);
  if (s.quant) {
    // The quantized products the layers run, at their stored width.
    std::vector<QuantMatrix> w13, w2;
    for (int64_t e = 0; e < kHostExperts; ++e) {
      w13.push_back(random_quant_matrix(s.quant->w13, 2 * s.F, s.D, rng));
      w2.push_back(random_quant_matrix(s.quant->w2, s.D, s.F, rng));
    }
    experts.bind_quantized_weights(std::move(w13), std::move(w2));
  }
  for (const std::string& name : experts.param_names()) {
    if (!(s.quant && (name == "w13" || name == "w2"))) {
      fill_uniform(experts.param(name), rng, -0.03, 0.03);
    }
  }
  HostExperts host(experts);

  const int64_t N = kHostExperts * kHostRows;
  std::vector<int64_t> offset_E;
  for (int64_t e = 0; e <= kHostExperts; ++e) offset_E.push_back(e * kHostRows);
  const Tensor x_ND = random_host({N, s.D}, s.dtype, rng, 1.0);
  const Tensor dy_ND = random_host({N, s.D}, s.dtype, rng, 1.0);
  Tensor score_N;
  if (s.absorb) {
    score_N = Tensor::empty({N}, s.score_dtype());
    score_N.fill(0.5);
  }
  Tensor y_ND = Tensor::empty({N, s.D}, s.dtype);
  Tensor dx_ND = Tensor::empty({N, s.D}, s.dtype);
  Tensor dscore_N = s.absorb ? Tensor::empty({N}, s.score_dtype()) : Tensor();
  const bool weight_grads = m == TrainMode::full;
  auto pass = [&] {
    SavedTensors saved("measure_host");
    host.forward(y_ND, x_ND, offset_E, score_N, saved, ExpertSaves{});
    host.backward(dx_ND, dscore_N, dy_ND, offset_E, score_N, saved, weight_grads, false);
  };
  pass();
  const double t = median_seconds(kRepeats, pass);
  return double(N) * flops_per_row(s, m) / t;
}

DeviceRates measure_device(Device& dev, const ExpertShape& s, TrainMode m,
                           const std::vector<int64_t>& buckets, ProgressMeter* meter) {
  TIERMOE_ASSERT(!buckets.empty());
  DeviceBuffers bufs(dev);
  Rng rng(2);
  DeviceRates r;

  // Launch overhead: the forward graph at a tiny shape, where compute is nil.
  {
    const ExpertShape tiny = tiny_shape(s);
    StagedExpert st = stage_expert(dev, bufs, tiny, TrainMode::lora, buckets.front(), rng);
    const Graph& g = dev.compile(expert_graph_key(GraphKind::expert_fwd, tiny, buckets.front()));
    auto launch = [&] {
      dev.launch(g, st.fwd);
      dev.sync();
    };
    launch();
    r.launch_s = median_seconds(2 * kRepeats - 1, launch);
  }
  if (meter) meter->advance(1);

  // Throughput: the mode's forward and backward at the largest bucket.
  {
    const int64_t G = buckets.back();
    StagedExpert st = stage_expert(dev, bufs, s, m, G, rng);
    const Graph& fwd = dev.compile(expert_graph_key(GraphKind::expert_fwd, s, G));
    const Graph& bwd = dev.compile(expert_graph_key(backward_graph_kind(m), s, G));
    auto pair = [&] {
      dev.launch(fwd, st.fwd);
      dev.launch(bwd, st.bwd);
      dev.sync();
    };
    pair();
    const double t = median_seconds(kRepeats, pair) - 2 * r.launch_s;
    r.flops_per_s = double(G) * flops_per_row(s, m) / std::max(t, 1e-9);
  }
  if (meter) meter->advance(1);

  // Link: a few MB each way.
  {
    const DeviceBuffer buf = bufs.alloc(kLinkBytes, BufferUsage::activations, "measure link");
    std::vector<uint8_t> host(kLinkBytes, 1);
    auto up = [&] {
      dev.upload(buf, 0, host.data(), kLinkBytes);
      dev.sync();
    };
    auto down = [&] {
      dev.download(host.data(), buf, 0, kLinkBytes);
      dev.sync();
    };
    up();
    down();
    const double t = median_seconds(kRepeats, up) + median_seconds(kRepeats, down);
    r.link_bytes_per_s = 2.0 * double(kLinkBytes) / std::max(t, 1e-9);
  }
  if (meter) meter->advance(1);
  return r;
}

size_t measure_host_bytes(const ExpertShape& s, TrainMode m) {
  const std::string what = "the start-up measurement's memory", where = "expert shape";
  const int64_t value = int64_t(dtype_size(s.dtype));
  // The experts' weights (and their gradients in full mode), then x, dy, y, dx.
  const int64_t weights = checked_product(
      {kHostExperts, 3, s.D, s.F, value, m == TrainMode::full ? 2 : 1}, what, where);
  const int64_t rows = checked_product({4, kHostExperts, kHostRows, s.D, value}, what, where);
  return size_t(checked_add(weights, rows, what, where));
}

size_t measure_device_bytes(const ExpertShape& s, TrainMode m,
                            const std::vector<int64_t>& buckets) {
  TIERMOE_ASSERT(!buckets.empty());
  const ExpertShape tiny = tiny_shape(s);
  return bytes_resident(tiny, TrainMode::lora) + bytes_workspace(tiny, buckets.front()) +
         bytes_resident(s, m) + bytes_workspace(s, buckets.back()) + kLinkBytes + kDeviceSlack;
}

}  // namespace tiermoe
