// The CUDA device as a Device: the budget and DeviceOutOfMemory, transfers
// larger than the staging buffers, zero fills, work that reuses the same
// device bytes at once from all three lanes (the event ordering), counters,
// injected faults, and windows checked before anything is queued. Each test
// skips, saying why, without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu.h"
#include "graph_cases.h"
#include "tiermoe/core/random.h"

namespace tiermoe {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng.below(256));
  return v;
}

TEST(CudaDevice, BudgetOutOfMemoryAndTheTracker) {
  TIERMOE_REQUIRE_GPU();
  MemoryTracker tracker;
  auto dev = testing::gpu(size_t(10) << 20, &tracker);
  EXPECT_EQ(dev->name(), "cuda:0");
  EXPECT_EQ(dev->capacity(), size_t(10) << 20);
  DeviceBuffer a = dev->alloc(size_t(6) << 20, BufferUsage::weights, "a");
  DeviceBuffer b = dev->alloc((size_t(4) << 20) - 1000, BufferUsage::grads, "b");
  EXPECT_EQ(dev->used(), (size_t(10) << 20) - 1000);
  EXPECT_EQ(tracker.live(MemTag::device), dev->used());
  try {
    dev->alloc(1001, BufferUsage::activations, "one too many");
    ADD_FAILURE() << "allocated past the budget";
  } catch (const DeviceOutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("one too many"), std::string::npos) << e.what();
  }
  dev->free(a);
  EXPECT_FALSE(a.valid());
  DeviceBuffer c = dev->alloc(size_t(5) << 20, BufferUsage::weights, "c");
  EXPECT_THROW(dev->free(a = DeviceBuffer{999, 1}), Error);
  dev->free(b);
  dev->free(c);
  EXPECT_EQ(dev->used(), 0u);
  EXPECT_EQ(tracker.live(MemTag::device), 0u);
  EXPECT_THROW(dev->alloc(0, BufferUsage::weights, "nothing"), Error);
}

// 20 MiB each way through 8 MiB of staging, at an offset, and a zero fill.
TEST(CudaDevice, TransfersLargerThanTheStagingRoundTrip) {
  TIERMOE_REQUIRE_GPU();
  CudaDeviceConfig cfg;
  cfg.memory_bytes = size_t(64) << 20;
  cfg.staging_bytes = size_t(8) << 20;
  auto dev = make_cuda_device(cfg);
  const size_t n = size_t(20) << 20, off = 4096;
  const std::vector<uint8_t> src = random_bytes(n, 1);
  DeviceBuffer buf = dev->alloc(n + 2 * off, BufferUsage::activations, "round trip");
  dev->upload(buf, off, src.data(), n);
  dev->zero(buf, off + 1000, 3000);
  std::vector<uint8_t> back(n, 0xAB);
  dev->download(back.data(), buf, off, n);
  dev->sync();
  std::vector<uint8_t> want = src;
  std::memset(want.data() + 1000, 0, 3000);
  EXPECT_TRUE(back == want);
  const DeviceCounters k = dev->counters();
  EXPECT_EQ(k.uploads, 1);
  EXPECT_EQ(k.downloads, 1);
  EXPECT_EQ(k.bytes_up, n);
  EXPECT_EQ(k.bytes_down, n);
  EXPECT_GT(k.transfer_s, 0);
  EXPECT_LE(k.busy_s, k.transfer_s + 1e-6);
  dev->free(buf);
}

// One workspace window reused launch after launch, as TieredExperts does with
// its two sets, with everything queued before one sync: each launch must see
// its own rows (uploads wait for the launch still reading), and each
// download its own launch's outputs (launches wait for the download still
// reading). Checked against the host run of each input separately.
TEST(CudaDevice, QueuedWorkReusingTheSameBytesKeepsCallOrder) {
  TIERMOE_REQUIRE_GPU();
  constexpr int64_t D = 64, F = 96, G = 32, rounds = 12;
  const testing::GraphCase c{DType::f32, true, false};
  auto dev = testing::gpu(size_t(64) << 20);
  const testing::GraphInputs in = testing::make_graph_problem(c, D, F, G, G, 100).in;
  const GraphKey key = testing::graph_key(GraphKind::expert_fwd, c, D, F, G);
  const Graph& fwd = dev->compile(key);
  auto put = [&](Shape shape, const char* what) {
    DeviceTensor t{{}, 0, std::move(shape), DType::f32};
    t.buffer = dev->alloc(t.nbytes(), BufferUsage::workspace, what);
    return t;
  };
  const DeviceTensor w13 = put({2 * F, D}, "w13"), w2 = put({D, F}, "w2"), x = put({G, D}, "x"),
                     s = put({G}, "score"), y = put({G, D}, "y"), h = put({G, 2 * F}, "h"),
                     a = put({G, F}, "a");
  upload_tensor(*dev, w13, in.w13);
  upload_tensor(*dev, w2, in.w2);
  Rng rng(8);
  std::vector<Tensor> xs, ss, ys;
  for (int64_t r = 0; r < rounds; ++r) {
    xs.push_back(testing::random_tensor({G, D}, DType::f32, rng));
    ss.push_back(Tensor::empty({G}, DType::f32));
    fill_uniform(ss.back(), rng, 0.1, 1.0);
    ys.push_back(Tensor::zeros({G, D}, DType::f32));
    upload_tensor(*dev, x, xs.back());
    upload_tensor(*dev, s, ss.back());
    GraphArgs args;
    args.set("x_GD", x).set("w13_FD", w13).set("w2_DF", w2).set("score_G", s);
    args.set("y_GD", y).set("h_G2F", h).set("a_GF", a);
    dev->launch(fwd, args);
    download_tensor(*dev, ys.back(), y);
  }
  dev->sync();
  const DeviceCounters k = dev->counters();
  EXPECT_EQ(k.launches, rounds);
  EXPECT_EQ(k.calls.at(key.str()), rounds);
  EXPECT_EQ(k.downloads, rounds);
  EXPECT_EQ(k.uploads, 2 + 2 * rounds);
  EXPECT_GT(k.compute_s, 0);
  EXPECT_LE(k.busy_s, k.compute_s + k.transfer_s + 1e-6);
  // Each round again, alone: the same graph on the same inputs gives the same bits.
  for (int64_t r = 0; r < rounds; ++r) {
    Tensor want = Tensor::zeros({G, D}, DType::f32);
    testing::GraphSlots slots = {{"x_GD", xs[size_t(r)]},
                                 {"w13_FD", in.w13},
                                 {"w2_DF", in.w2},
                                 {"score_G", ss[size_t(r)]},
                                 {"y_GD", want},
                                 {"h_G2F", Tensor::zeros({G, 2 * F}, DType::f32)},
                                 {"a_GF", Tensor::zeros({G, F}, DType::f32)}};
    testing::device_runner (*dev)(key, slots, false);
    EXPECT_TRUE(testing::bitwise_equal(ys[size_t(r)], want, "y")) << "round " << r;
  }
}

TEST(CudaDevice, InjectedFaultsAndTheirRecovery) {
  TIERMOE_REQUIRE_GPU();
  auto dev = testing::gpu(size_t(16) << 20);
  dev->inject(DeviceFaults{.fail_alloc = 1});
  DeviceBuffer ok = dev->alloc(1024, BufferUsage::weights, "first");
  EXPECT_THROW(dev->alloc(1024, BufferUsage::weights, "second"), DeviceOutOfMemory);
  DeviceBuffer later = dev->alloc(1024, BufferUsage::weights, "third");

  const testing::GraphCase c{DType::f32, false, false};
  const auto p = testing::make_graph_problem(c, 32, 48, 16, 16, 4);
  testing::GraphSlots slots = {{"x_GD", p.in.x},
                               {"w13_FD", p.in.w13},
                               {"w2_DF", p.in.w2},
                               {"y_GD", Tensor::zeros({16, 32}, DType::f32)},
                               {"h_G2F", Tensor::zeros({16, 96}, DType::f32)},
                               {"a_GF", Tensor::zeros({16, 48}, DType::f32)}};
  std::vector<DeviceTensor> on;
  GraphArgs args;
  for (auto& [name, t] : slots) {
    on.push_back(DeviceTensor{dev->alloc(t.nbytes(), BufferUsage::activations, name), 0, t.shape(),
                              t.dtype()});
    upload_tensor(*dev, on.back(), t);
    args.set(name, on.back());
  }
  dev->sync();
  const Graph& g = dev->compile(testing::graph_key(GraphKind::expert_fwd, c, 32, 48, 16));
  dev->inject(DeviceFaults{.fail_launch = 0});
  dev->launch(g, args);
  Tensor y = Tensor::zeros({16, 32}, DType::f32);
  download_tensor(*dev, y, on[3]);  // skipped after the failure
  try {
    dev->sync();
    ADD_FAILURE() << "the injected launch fault was not reported";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1 later ops were skipped"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(dev->sync());  // reported once
  dev->launch(g, args);
  download_tensor(*dev, y, on[3]);
  dev->sync();
  EXPECT_TRUE(testing::close_rows(y, p.want.y, 1e-5, "y after recovery"));
  dev->free(ok);
  dev->free(later);
  for (DeviceTensor& t : on) dev->free(t.buffer);
}

TEST(CudaDevice, BadWindowsAreRefusedBeforeAnythingIsQueued) {
  TIERMOE_REQUIRE_GPU();
  auto dev = testing::gpu(size_t(1) << 20);
  DeviceBuffer b = dev->alloc(1000, BufferUsage::workspace, "small");
  std::vector<uint8_t> host(2000);
  EXPECT_THROW(dev->upload(b, 500, host.data(), 501), Error);
  EXPECT_THROW(dev->download(host.data(), b, 1001, 0), Error);
  EXPECT_THROW(dev->zero(DeviceBuffer{77, 10}, 0, 10), Error);
  EXPECT_THROW(dev->upload(b, 0, nullptr, 10), Error);
  dev->sync();
  EXPECT_EQ(dev->counters().uploads, 0);
  dev->free(b);
}

}  // namespace
}  // namespace tiermoe
