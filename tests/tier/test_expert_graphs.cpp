// The expert graphs on a CpuDevice against the host's GroupedExperts
// (docs/architecture.md, parity rules): a launch over G rows, of which the caller's M are
// real and the rest zero padding with score 0, gives the host's first M rows
// of y, h, a, dx and dscore and the host's weight-gradient sums, bitwise.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../src/kernels/cpu/gemm/driver.h"
#include "../../src/kernels/cpu/onednn.h"
#include "common/testing.h"
#include "moe/moe_test_util.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/moe/expert_math.h"
#include "tiermoe/tier/cpu_device.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;

DType score_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

// What a first product sets up: GEMM scratch growing (TierMoE's kernels) or a
// new oneDNN primitive (the onednn baseline). Launches of compiled graphs
// must set up nothing (their warm-up did).
int64_t kernel_setups() {
  return cpu::gemm::scratch_growths() + int64_t(cpu::onednn::cached_primitives());
}

struct Case {
  DType dtype;
  bool absorb, bias;
  ExpertActivation activation = ExpertActivation::swiglu;
  KernelSet kernels = KernelSet::cpu;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return detail::str_of(dtype_name(c.dtype), c.absorb ? "_absorb" : "_post", c.bias ? "_bias" : "",
                        "_", expert_activation_name(c.activation),
                        c.kernels == KernelSet::ref ? "_ref" : "");
}

// GPT-OSS's clamp with a small limit, so that the clamp is exercised; the key
// carries it to the graph.
constexpr GptOssActivation kGptOss{.alpha = 1.702, .limit = 1.5};

ExpertsConfig experts_config(const Case& c, int64_t E, int64_t D, int64_t F) {
  ExpertsConfig cfg;
  cfg.num_experts = E, cfg.hidden = D, cfg.ffn = F;
  cfg.activation = c.activation;
  cfg.gpt_oss = kGptOss;
  cfg.bias = c.bias;
  cfg.kernels = c.kernels;
  return cfg;
}

GraphKey graph_key(GraphKind kind, const Case& c, int64_t D, int64_t F, int64_t G) {
  return GraphKey{
      .kind = kind,
      .D = D,
      .F = F,
      .G = G,
      .dtype = c.dtype,
      .activation = c.activation,
      .absorb = c.absorb,
      .bias = c.bias,
      .gpt_oss = c.activation == ExpertActivation::gpt_oss ? kGptOss : GptOssActivation{}};
}

CpuDeviceConfig device_config(const Case& c, MemoryTracker& tracker, int threads = 1) {
  CpuDeviceConfig cfg;
  cfg.memory_bytes = size_t(256) << 20;
  cfg.threads = threads;
  cfg.kernels = c.kernels;
  cfg.tracker = &tracker;
  return cfg;
}

ExpertGrads clone_grads(const ExpertGrads& g) {
  auto copy = [](const Tensor& t) { return t.defined() ? t.clone() : Tensor(); };
  return {copy(g.dw13_FD), copy(g.dw2_DF), copy(g.db13_F), copy(g.db2_D), copy(g.dnorm_D)};
}

// One expert's M rows and what the host computes for them.
struct HostRun {
  Tensor x, score, dy;          // inputs (score undefined unless absorbed)
  Tensor y, h, a;               // forward
  Tensor dx_only, dscore_only;  // backward without weight grads
  Tensor dx, dscore;            // backward with weight grads
  ExpertGrads grads;            // 0 + the call's sums
};

HostRun host_inputs(const GroupedExperts& ex, int64_t M, bool absorb, Rng& rng) {
  const DType t = ex.dtype();
  HostRun r;
  r.x = testing::random_tensor({M, ex.config().hidden}, t, rng);
  r.dy = testing::random_tensor({M, ex.config().hidden}, t, rng);
  if (absorb) {
    r.score = Tensor::empty({M}, score_dtype(t));
    fill_uniform(r.score, rng, 0.1, 1.0);
  }
  return r;
}

void host_compute(GroupedExperts& ex, int64_t e, HostRun& r) {
  const DType t = ex.dtype(), s = score_dtype(t);
  const int64_t M = r.x.size(0), D = ex.config().hidden, F = ex.config().ffn;
  const bool absorb = r.score.defined();
  r.y = Tensor::zeros({M, D}, t), r.h = Tensor::zeros({M, 2 * F}, t);
  r.a = Tensor::zeros({M, F}, t);
  ExpertRowsActs acts;
  acts.h_M2F = r.h, acts.a_MF = r.a;
  ex.forward_rows(e, r.y, acts, r.x, r.score);

  r.dx_only = Tensor::zeros({M, D}, t);
  if (absorb) r.dscore_only = Tensor::zeros({M}, s);
  ex.backward_rows(e, r.dx_only, r.dscore_only, r.dy, acts, r.score, /*weight_grads=*/false);

  ex.allocate_grads();
  ex.zero_grad();
  acts.x_MD = r.x;
  r.dx = Tensor::zeros({M, D}, t);
  if (absorb) r.dscore = Tensor::zeros({M}, s);
  ex.backward_rows(e, r.dx, r.dscore, r.dy, acts, r.score, /*weight_grads=*/true);
  r.grads = clone_grads(ex.grads(e));
}

// Device memory of one test: zero-filled windows, each its own buffer, and
// the host tensors in flight, which must live until sync().
class DeviceRig {
 public:
  explicit DeviceRig(CpuDevice& dev) : dev_(dev) {}
  ~DeviceRig() {
    for (DeviceBuffer& b : buffers_) dev_.free(b);
  }
  CpuDevice& dev() { return dev_; }

  DeviceTensor zeros(Shape shape, DType dtype, const std::string& what) {
    DeviceTensor t;
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.buffer = dev_.alloc(t.nbytes(), BufferUsage::activations, what);
    buffers_.push_back(t.buffer);
    dev_.zero(t.buffer, 0, t.nbytes());
    return t;
  }
  // `host` in the first rows of a zeroed window of `rows` rows.
  DeviceTensor put(const Tensor& host, int64_t rows, const std::string& what) {
    Shape shape = host.shape();
    shape[0] = rows;
    DeviceTensor t = zeros(shape, host.dtype(), what);
    upload_tensor(dev_, t, host);
    staged_.push_back(host);
    return t;
  }
  void upload_at(const DeviceTensor& t, int64_t first_row, const Tensor& host) {
    DeviceTensor w = window(t, first_row, host.size(0));
    upload_tensor(dev_, w, host);
    staged_.push_back(host);
  }
  Tensor fetch(const DeviceTensor& t) {
    Tensor host = Tensor::zeros(t.shape, t.dtype);
    download_tensor(dev_, host, t);
    return host;
  }
  // Rows [first, first + count) of a window.
  static DeviceTensor window(DeviceTensor t, int64_t first, int64_t count) {
    const size_t row_bytes = t.nbytes() / size_t(t.shape[0]);
    t.offset += size_t(first) * row_bytes;
    t.shape[0] = count;
    return t;
  }

 private:
  CpuDevice& dev_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<Tensor> staged_;
};

// One expert's weights and G-row inputs on the device.
struct DeviceExpert {
  Case c;
  int64_t D, F, G;
  DeviceTensor w13, w2, b13, b2, x, score, dy;
};

// What a test spoils on purpose in the device's inputs.
enum class Spoil { nothing, double_one_score, dirty_dy_padding };

DeviceExpert put_expert(DeviceRig& rig, const GroupedExperts& ex, int64_t e, const HostRun& in,
                        const Case& c, int64_t G, Spoil spoil = Spoil::nothing,
                        Rng* rng = nullptr) {
  const int64_t D = ex.config().hidden, F = ex.config().ffn, M = in.x.size(0);
  const ExpertWeights w = ex.weights(e);
  DeviceExpert d;
  d.c = c, d.D = D, d.F = F, d.G = G;
  d.w13 = rig.put(w.w13_FD, 2 * F, "w13");
  d.w2 = rig.put(w.w2_DF, D, "w2");
  if (c.bias) {
    d.b13 = rig.put(w.b13_F, 2 * F, "b13");
    d.b2 = rig.put(w.b2_D, D, "b2");
  }
  d.x = rig.put(in.x, G, "x");
  if (c.absorb) {
    Tensor score = in.score;
    if (spoil == Spoil::double_one_score) {
      score = in.score.clone();
      score.set(M / 2, 2 * score.get(M / 2));
    }
    d.score = rig.put(score, G, "score");
  }
  d.dy = rig.put(in.dy, G, "dy");
  if (spoil == Spoil::dirty_dy_padding) {
    rig.upload_at(d.dy, M, testing::random_tensor({G - M, D}, c.dtype, *rng));
  }
  return d;
}

void set_weights(GraphArgs& args, const DeviceExpert& d) {
  args.set("w13_FD", d.w13).set("w2_DF", d.w2);
  if (d.c.bias) args.set("b13_F", d.b13).set("b2_D", d.b2);
  if (d.c.absorb) args.set("score_G", d.score);
}

// The device's results, G rows each, as downloaded.
struct DeviceRun {
  Tensor y, h, a, dx_only, dscore_only, dx, dscore;
  ExpertGrads sums;
};

// Enqueues the three expert graphs over one expert's G rows, chained on the
// device (the backward graphs read the forward graph's h and a), and the
// downloads of their results; valid after sync().
DeviceRun enqueue_graphs(DeviceRig& rig, const DeviceExpert& d, Rng& rng) {
  CpuDevice& dev = rig.dev();
  const Case& c = d.c;
  const int64_t D = d.D, F = d.F, G = d.G;
  const DType t = c.dtype, s = score_dtype(t);

  const DeviceTensor y = rig.zeros({G, D}, t, "y"), h = rig.zeros({G, 2 * F}, t, "h"),
                     a = rig.zeros({G, F}, t, "a");
  GraphArgs fwd;
  fwd.set("x_GD", d.x).set("y_GD", y).set("h_G2F", h).set("a_GF", a);
  set_weights(fwd, d);
  dev.launch(dev.compile(graph_key(GraphKind::expert_fwd, c, D, F, G)), fwd);

  const DeviceTensor dx_only = rig.zeros({G, D}, t, "dx_only");
  DeviceTensor dscore_only;
  GraphArgs bdx;
  bdx.set("dy_GD", d.dy).set("h_G2F", h).set("dx_GD", dx_only);
  set_weights(bdx, d);
  if (c.absorb) {
    dscore_only = rig.zeros({G}, s, "dscore_only");
    bdx.set("a_GF", a).set("dscore_G", dscore_only);
  }
  dev.launch(dev.compile(graph_key(GraphKind::expert_bwd_dx, c, D, F, G)), bdx);

  // Started sums overwrite their buffers: fill them with junk first.
  auto junk_sum = [&](Shape shape, const char* what) {
    return rig.put(testing::random_tensor(shape, s, rng), shape[0], what);
  };
  const DeviceTensor dx = rig.zeros({G, D}, t, "dx");
  DeviceTensor dscore, db13, db2;
  const DeviceTensor dw13 = junk_sum({2 * F, D}, "dw13"), dw2 = junk_sum({D, F}, "dw2");
  GraphArgs bdw;
  bdw.set("dy_GD", d.dy).set("h_G2F", h).set("x_GD", d.x).set("a_GF", a).set("dx_GD", dx);
  bdw.set("dw13_FD", dw13).set("dw2_DF", dw2);
  set_weights(bdw, d);
  if (c.absorb) {
    dscore = rig.zeros({G}, s, "dscore");
    bdw.set("dscore_G", dscore);
  }
  if (c.bias) {
    db13 = junk_sum({2 * F}, "db13"), db2 = junk_sum({D}, "db2");
    bdw.set("db13_F", db13).set("db2_D", db2);
  }
  bdw.ints["sum_started"] = 0;
  dev.launch(dev.compile(graph_key(GraphKind::expert_bwd_dx_dw, c, D, F, G)), bdw);

  DeviceRun r;
  r.y = rig.fetch(y), r.h = rig.fetch(h), r.a = rig.fetch(a);
  r.dx_only = rig.fetch(dx_only), r.dx = rig.fetch(dx);
  if (c.absorb) r.dscore_only = rig.fetch(dscore_only), r.dscore = rig.fetch(dscore);
  r.sums.dw13_FD = rig.fetch(dw13), r.sums.dw2_DF = rig.fetch(dw2);
  if (c.bias) r.sums.db13_F = rig.fetch(db13), r.sums.db2_D = rig.fetch(db2);
  return r;
}

// The device's first M rows against the host's M rows.
::testing::AssertionResult first_rows(const Tensor& device_G, const Tensor& host_M,
                                      const std::string& name) {
  return bitwise_equal(device_G.rows(0, host_M.size(0)), host_M, name);
}

void expect_parity(const DeviceRun& d, const HostRun& h, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_TRUE(first_rows(d.y, h.y, "y"));
  EXPECT_TRUE(first_rows(d.h, h.h, "h"));
  EXPECT_TRUE(first_rows(d.a, h.a, "a"));
  EXPECT_TRUE(first_rows(d.dx_only, h.dx_only, "dx (expert_bwd_dx)"));
  EXPECT_TRUE(first_rows(d.dx, h.dx, "dx (expert_bwd_dx_dw)"));
  if (h.score.defined()) {
    EXPECT_TRUE(first_rows(d.dscore_only, h.dscore_only, "dscore (expert_bwd_dx)"));
    EXPECT_TRUE(first_rows(d.dscore, h.dscore, "dscore (expert_bwd_dx_dw)"));
  }
  EXPECT_TRUE(bitwise_equal(d.sums.dw13_FD, h.grads.dw13_FD, "dw13"));
  EXPECT_TRUE(bitwise_equal(d.sums.dw2_DF, h.grads.dw2_DF, "dw2"));
  if (h.grads.db13_F.defined()) {
    EXPECT_TRUE(bitwise_equal(d.sums.db13_F, h.grads.db13_F, "db13"));
    EXPECT_TRUE(bitwise_equal(d.sums.db2_D, h.grads.db2_D, "db2"));
  }
}

class GraphParity : public ::testing::TestWithParam<Case> {};

// Two experts of one GroupedExperts (their weights are views at different
// offsets) with 11 and 5 of G = 16 rows, through the same compiled graphs.
TEST_P(GraphParity, FirstRowsAndSumsEqualTheHostBitwise) {
  const Case c = GetParam();
  constexpr int64_t D = 32, F = 48, G = 16;
  Rng rng(17);
  GroupedExperts ex(experts_config(c, 2, D, F), c.dtype);
  testing::fill_experts(ex, rng);
  MemoryTracker tracker;
  CpuDevice dev(device_config(c, tracker));
  {
    DeviceRig rig(dev);
    std::vector<HostRun> host;
    for (int64_t e : {0, 1}) {
      host.push_back(host_inputs(ex, e == 0 ? 11 : 5, c.absorb, rng));
      host_compute(ex, e, host.back());
    }
    for (int kind = 0; kind < 3; ++kind) dev.compile(graph_key(GraphKind(kind), c, D, F, G));
    const int64_t setups = kernel_setups();
    for (int64_t e : {0, 1}) {
      const HostRun& want = host[size_t(e)];
      DeviceRun got = enqueue_graphs(rig, put_expert(rig, ex, e, want, c, G), rng);
      dev.sync();
      expect_parity(got, want, "expert " + std::to_string(e));
    }
    EXPECT_EQ(dev.counters().launches, 6);
    // Compiled graphs run on kernels set up at compile time: launching sets up none.
    EXPECT_EQ(kernel_setups(), setups);
  }
  EXPECT_EQ(dev.used(), 0u);
  EXPECT_EQ(tracker.live(MemTag::device), 0u);
}

std::vector<Case> parity_cases() {
  std::vector<Case> cases;
  for (DType t : {DType::f64, DType::f32, DType::bf16}) {
    for (bool absorb : {true, false}) {
      for (bool bias : {false, true}) cases.push_back({t, absorb, bias});
    }
  }
  const ExpertActivation gpt = ExpertActivation::gpt_oss;
  cases.push_back({DType::f64, false, true, gpt});
  cases.push_back({DType::f32, true, true, gpt});
  cases.push_back({DType::bf16, true, true, gpt});
  cases.push_back({DType::bf16, false, false, gpt});
  cases.push_back({DType::f32, true, true, ExpertActivation::swiglu, KernelSet::ref});
  cases.push_back({DType::bf16, false, true, ExpertActivation::swiglu, KernelSet::ref});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Tier, GraphParity, ::testing::ValuesIn(parity_cases()), case_name);

// The parity check has teeth: a score doubled on one row changes exactly that
// row's outputs; junk in dy's padding rows changes the weight-gradient sums
// when the padding's activations are not zero (experts with biases,
// post-combine scores), while every real row still agrees. Absorbed, the
// zero score of the padding rows keeps the same junk out of every sum.
TEST(GraphParityCheck, FailsOnASpoiledScoreOrDirtyPadding) {
  constexpr int64_t D = 32, F = 48, G = 16, M = 11;
  const Case absorbed{DType::f32, true, true}, post{DType::f32, false, true};
  Rng rng(5);
  GroupedExperts ex(experts_config(absorbed, 1, D, F), DType::f32);
  testing::fill_experts(ex, rng);
  HostRun host = host_inputs(ex, M, true, rng), host_post = host_inputs(ex, M, false, rng);
  host_compute(ex, 0, host);
  host_compute(ex, 0, host_post);
  MemoryTracker tracker;
  CpuDevice dev(device_config(absorbed, tracker));
  DeviceRig rig(dev);

  const DeviceRun doubled =
      enqueue_graphs(rig, put_expert(rig, ex, 0, host, absorbed, G, Spoil::double_one_score), rng);
  const DeviceRun dirty = enqueue_graphs(
      rig, put_expert(rig, ex, 0, host, absorbed, G, Spoil::dirty_dy_padding, &rng), rng);
  const DeviceRun dirty_post = enqueue_graphs(
      rig, put_expert(rig, ex, 0, host_post, post, G, Spoil::dirty_dy_padding, &rng), rng);
  dev.sync();

  const int64_t bad = M / 2;
  EXPECT_FALSE(first_rows(doubled.y, host.y, "y"));
  EXPECT_TRUE(bitwise_equal(doubled.y.rows(0, bad), host.y.rows(0, bad), "y before the row"));
  EXPECT_FALSE(bitwise_equal(doubled.y.rows(bad, bad + 1), host.y.rows(bad, bad + 1), "y row"));
  EXPECT_FALSE(first_rows(doubled.dx, host.dx, "dx"));
  EXPECT_FALSE(bitwise_equal(doubled.sums.dw2_DF, host.grads.dw2_DF, "dw2"));

  expect_parity(dirty, host, "absorbed, dirty dy padding");

  EXPECT_TRUE(first_rows(dirty_post.y, host_post.y, "y"));
  EXPECT_TRUE(first_rows(dirty_post.dx, host_post.dx, "dx"));
  EXPECT_FALSE(bitwise_equal(dirty_post.sums.dw2_DF, host_post.grads.dw2_DF, "dw2"));
  EXPECT_FALSE(bitwise_equal(dirty_post.sums.db2_D, host_post.grads.db2_D, "db2"));
}

class GraphContinuation : public ::testing::TestWithParam<Case> {};

// M = 2.5 G rows of one expert as three launches (the sums started, then
// continued twice; the last launch half padding) equal one host backward
// over the M rows summing in blocks of G rows, bitwise.
TEST_P(GraphContinuation, LaunchBySumEqualsTheHostsBlockedSum) {
  const Case c = GetParam();
  constexpr int64_t D = 24, F = 40, G = 16, M = 40, launches = 3;
  const DType t = c.dtype, s = score_dtype(t);
  Rng rng(29);
  ExpertsConfig cfg = experts_config(c, 1, D, F);
  cfg.dw_row_block = G;
  GroupedExperts ex(cfg, t);
  testing::fill_experts(ex, rng);
  HostRun host = host_inputs(ex, M, c.absorb, rng);
  host_compute(ex, 0, host);

  MemoryTracker tracker;
  CpuDevice dev(device_config(c, tracker));
  DeviceRig rig(dev);
  DeviceExpert d = put_expert(rig, ex, 0, host, c, launches * G);
  const DeviceTensor y = rig.zeros({launches * G, D}, t, "y"),
                     h = rig.zeros({launches * G, 2 * F}, t, "h"),
                     a = rig.zeros({launches * G, F}, t, "a"),
                     dx = rig.zeros({launches * G, D}, t, "dx");
  DeviceTensor dscore, db13, db2;
  if (c.absorb) dscore = rig.zeros({launches * G}, s, "dscore");
  const DeviceTensor dw13 = rig.zeros({2 * F, D}, s, "dw13"), dw2 = rig.zeros({D, F}, s, "dw2");
  if (c.bias) db13 = rig.zeros({2 * F}, s, "db13"), db2 = rig.zeros({D}, s, "db2");
  const Graph& fwd = dev.compile(graph_key(GraphKind::expert_fwd, c, D, F, G));
  const Graph& bwd = dev.compile(graph_key(GraphKind::expert_bwd_dx_dw, c, D, F, G));
  const int64_t setups = kernel_setups();

  auto rows = [&](const DeviceTensor& w, int64_t i) { return DeviceRig::window(w, i * G, G); };
  auto set_inputs = [&](GraphArgs& args, int64_t i) {
    args.set("w13_FD", d.w13).set("w2_DF", d.w2);
    if (c.bias) args.set("b13_F", d.b13).set("b2_D", d.b2);
    if (c.absorb) args.set("score_G", rows(d.score, i));
  };
  for (int64_t i = 0; i < launches; ++i) {
    GraphArgs args;
    args.set("x_GD", rows(d.x, i)).set("y_GD", rows(y, i)).set("h_G2F", rows(h, i));
    args.set("a_GF", rows(a, i));
    set_inputs(args, i);
    dev.launch(fwd, args);
  }
  for (int64_t i = 0; i < launches; ++i) {
    GraphArgs args;
    args.set("dy_GD", rows(d.dy, i)).set("h_G2F", rows(h, i)).set("x_GD", rows(d.x, i));
    args.set("a_GF", rows(a, i)).set("dx_GD", rows(dx, i));
    args.set("dw13_FD", dw13).set("dw2_DF", dw2);
    set_inputs(args, i);
    if (c.absorb) args.set("dscore_G", rows(dscore, i));
    if (c.bias) args.set("db13_F", db13).set("db2_D", db2);
    args.ints["sum_started"] = i > 0;
    dev.launch(bwd, args);
  }
  DeviceRun got;
  got.y = rig.fetch(y), got.dx = rig.fetch(dx);
  if (c.absorb) got.dscore = rig.fetch(dscore);
  got.sums.dw13_FD = rig.fetch(dw13), got.sums.dw2_DF = rig.fetch(dw2);
  if (c.bias) got.sums.db13_F = rig.fetch(db13), got.sums.db2_D = rig.fetch(db2);
  dev.sync();
  EXPECT_EQ(kernel_setups(), setups);

  EXPECT_TRUE(first_rows(got.y, host.y, "y"));
  EXPECT_TRUE(first_rows(got.dx, host.dx, "dx"));
  if (c.absorb) {
    EXPECT_TRUE(first_rows(got.dscore, host.dscore, "dscore"));
  }
  EXPECT_TRUE(bitwise_equal(got.sums.dw13_FD, host.grads.dw13_FD, "dw13"));
  EXPECT_TRUE(bitwise_equal(got.sums.dw2_DF, host.grads.dw2_DF, "dw2"));
  if (c.bias) {
    EXPECT_TRUE(bitwise_equal(got.sums.db13_F, host.grads.db13_F, "db13"));
    EXPECT_TRUE(bitwise_equal(got.sums.db2_D, host.grads.db2_D, "db2"));
  }

  // The block size is what makes the sums agree: the host summing all M rows
  // in one block rounds differently.
  ExpertsConfig one_block = cfg;
  one_block.dw_row_block = M;
  GroupedExperts ex1(one_block, t);
  for (const std::string& n : ex.param_names()) ex1.param(n).copy_from(ex.param(n));
  HostRun host1 = host;
  host_compute(ex1, 0, host1);
  EXPECT_TRUE(bitwise_equal(host1.dx, host.dx, "dx (one block)"));
  EXPECT_FALSE(bitwise_equal(got.sums.dw13_FD, host1.grads.dw13_FD, "dw13 (one block)"));
}

INSTANTIATE_TEST_SUITE_P(
    Tier, GraphContinuation,
    ::testing::Values(Case{DType::f64, true, true}, Case{DType::f32, true, true},
                      Case{DType::bf16, true, true}, Case{DType::f32, false, false},
                      Case{DType::bf16, false, true, ExpertActivation::gpt_oss}),
    case_name);

// Host experts computing on this thread while the device computes the same
// shapes on its worker, with the same thread count (so both run the very
// same oneDNN primitives at once), give bitwise the results each gives alone.
TEST(GraphConcurrency, HostAndDeviceAtOnceEqualEachAlone) {
  constexpr int64_t D = 128, F = 192, G = 64, rounds = 8;
  constexpr int threads = 2;
  const int host_threads = num_threads();
  set_num_threads(threads);
  for (DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const Case c{t, true, false};
    Rng rng(3);
    GroupedExperts ex(experts_config(c, 1, D, F), t);
    testing::fill_experts(ex, rng, 0.1);
    HostRun alone = host_inputs(ex, G, c.absorb, rng);
    host_compute(ex, 0, alone);

    MemoryTracker tracker;
    CpuDevice dev(device_config(c, tracker, threads));
    DeviceRig rig(dev);
    const DeviceExpert d = put_expert(rig, ex, 0, alone, c, G);
    DeviceRun device_alone = enqueue_graphs(rig, d, rng);
    dev.sync();
    expect_parity(device_alone, alone, "device alone");

    // Each round enqueues the device's work, then computes on the host while
    // the worker runs it.
    std::vector<DeviceRun> on_device;
    for (int64_t r = 0; r < rounds; ++r) {
      on_device.push_back(enqueue_graphs(rig, d, rng));
      HostRun again = alone;
      host_compute(ex, 0, again);
      expect_parity(device_alone, again, "host round " + std::to_string(r));
    }
    dev.sync();
    for (int64_t r = 0; r < rounds; ++r) {
      expect_parity(on_device[size_t(r)], alone, "device round " + std::to_string(r));
    }
  }
  set_num_threads(host_threads);
}

}  // namespace
}  // namespace tiermoe
