// CpuDevice as a Device: memory under a budget, the in-order stream,
// window and argument checks, the graph cache, counters and injected faults.
// The expert graphs' numbers are held by test_expert_graphs.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "common/testing.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/tier/cpu_device.h"

namespace tiermoe {
namespace {

using ::testing::HasSubstr;

// The message of the exception `fn` throws as E (fails the test otherwise).
template <class E, class Fn>
std::string message_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

CpuDeviceConfig small_config(MemoryTracker& tracker, size_t bytes = 1000) {
  CpuDeviceConfig c;
  c.memory_bytes = bytes;
  c.tracker = &tracker;
  return c;
}

std::vector<uint8_t> iota_bytes(size_t n, uint8_t start) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A small f32 forward graph and its buffers, zero weights: y = 0.
struct TinyForward {
  GraphKey key{
      .kind = GraphKind::expert_fwd, .D = 4, .F = 3, .G = 2, .dtype = DType::f32, .absorb = false};
  DeviceTensor x, w13, w2, y, h, a;

  explicit TinyForward(Device& dev) {
    auto make = [&](Shape s, const char* what) {
      DeviceTensor t;
      t.shape = s;
      t.buffer = dev.alloc(t.nbytes(), BufferUsage::activations, what);
      dev.zero(t.buffer, 0, t.nbytes());
      return t;
    };
    x = make({2, 4}, "x"), w13 = make({6, 4}, "w13"), w2 = make({4, 3}, "w2");
    y = make({2, 4}, "y"), h = make({2, 6}, "h"), a = make({2, 3}, "a");
  }
  GraphArgs args() const {
    GraphArgs g;
    g.set("x_GD", x).set("w13_FD", w13).set("w2_DF", w2).set("y_GD", y).set("h_G2F", h);
    g.set("a_GF", a);
    return g;
  }
};

TEST(CpuDevice, BudgetHoldsAtTheExactBoundaryAndTheTrackerFollows) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  EXPECT_EQ(dev.name(), "cpu");
  EXPECT_EQ(dev.capacity(), 1000u);
  DeviceBuffer a = dev.alloc(600, BufferUsage::weights, "a");
  DeviceBuffer b = dev.alloc(400, BufferUsage::activations, "b");
  EXPECT_EQ(dev.used(), 1000u);
  EXPECT_EQ(tracker.live(MemTag::device), 1000u);
  EXPECT_THROW(dev.alloc(1, BufferUsage::workspace, "c"), DeviceOutOfMemory);
  EXPECT_EQ(dev.used(), 1000u);  // a failed alloc holds nothing

  dev.free(b);
  EXPECT_FALSE(b.valid());
  EXPECT_EQ(dev.used(), 600u);
  EXPECT_EQ(tracker.live(MemTag::device), 600u);
  EXPECT_THROW(dev.alloc(401, BufferUsage::grads, "d"), DeviceOutOfMemory);
  DeviceBuffer d = dev.alloc(400, BufferUsage::grads, "d");
  EXPECT_EQ(dev.used(), 1000u);
  EXPECT_EQ(tracker.peak(MemTag::device), 1000u);
  dev.free(a);
  dev.free(d);
  EXPECT_EQ(dev.used(), 0u);
  EXPECT_EQ(tracker.live(MemTag::device), 0u);
}

TEST(CpuDevice, OutOfMemoryNamesWhatTheBytesAndTheBudget) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  DeviceBuffer a = dev.alloc(600, BufferUsage::weights, "w13 of expert 3");
  std::string msg = message_of<DeviceOutOfMemory>(
      [&] { dev.alloc(401, BufferUsage::weights, "w2 of expert 7"); });
  EXPECT_THAT(msg, HasSubstr("w2 of expert 7"));
  EXPECT_THAT(msg, HasSubstr("401 bytes"));
  EXPECT_THAT(msg, HasSubstr("600 of the 1000-byte budget"));
  EXPECT_THAT(msg, HasSubstr("--device-memory"));
  EXPECT_THAT(msg, HasSubstr("fewer experts resident"));
  dev.free(a);
}

TEST(CpuDevice, ZeroBytesAndStaleHandlesAreErrors) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  EXPECT_THAT(message_of<Error>([&] { dev.alloc(0, BufferUsage::weights, "empty bias"); }),
              HasSubstr("empty bias"));
  DeviceBuffer none;
  dev.free(none);  // like free(nullptr)
  DeviceBuffer a = dev.alloc(64, BufferUsage::weights, "a");
  DeviceBuffer copy = a;
  dev.free(a);
  EXPECT_THAT(message_of<Error>([&] { dev.free(copy); }), HasSubstr("not a live buffer"));
  uint8_t byte = 0;
  EXPECT_THAT(message_of<Error>([&] { dev.upload(copy, 0, &byte, 1); }), HasSubstr("upload"));
}

TEST(CpuDevice, DestroyingTheDeviceReturnsItsMemory) {
  MemoryTracker tracker;
  std::vector<uint8_t> host(300, 7);
  {
    CpuDevice dev(small_config(tracker));
    DeviceBuffer kept = dev.alloc(300, BufferUsage::weights, "kept");
    for (int i = 0; i < 100; ++i) dev.upload(kept, 0, host.data(), host.size());
    EXPECT_EQ(tracker.live(MemTag::device), 300u);
  }  // queued work never synced: discarded
  EXPECT_EQ(tracker.live(MemTag::device), 0u);
}

TEST(CpuDevice, FreeWaitsForQueuedWorkAndLeavesFailuresToSync) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  DeviceBuffer a = dev.alloc(256, BufferUsage::activations, "a");
  const std::vector<uint8_t> sent = iota_bytes(256, 3);
  std::vector<uint8_t> got(256, 0);
  dev.upload(a, 0, sent.data(), sent.size());
  dev.download(got.data(), a, 0, got.size());
  dev.free(a);
  EXPECT_EQ(got, sent);  // no sync: free ran the queue first

  TinyForward t(dev);
  const Graph& g = dev.compile(t.key);
  dev.inject({.fail_launch = 0});
  dev.launch(g, t.args());
  DeviceBuffer b = dev.alloc(8, BufferUsage::workspace, "b");
  dev.free(b);
  EXPECT_THROW(dev.sync(), DeviceError);
}

TEST(CpuDevice, PartialWindowsRoundTripAndZero) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  DeviceBuffer buf = dev.alloc(256, BufferUsage::activations, "buf");
  const std::vector<uint8_t> base = iota_bytes(256, 0), patch = iota_bytes(32, 200);
  std::vector<uint8_t> window(50, 0xEE), all(256, 0xEE);
  dev.upload(buf, 0, base.data(), base.size());
  dev.upload(buf, 100, patch.data(), patch.size());
  dev.download(window.data(), buf, 90, window.size());
  dev.zero(buf, 10, 20);
  dev.download(all.data(), buf, 0, all.size());
  dev.sync();

  std::vector<uint8_t> want = base;
  std::copy(patch.begin(), patch.end(), want.begin() + 100);
  EXPECT_EQ(window, std::vector<uint8_t>(want.begin() + 90, want.begin() + 140));
  std::fill(want.begin() + 10, want.begin() + 30, 0);
  EXPECT_EQ(all, want);
  dev.free(buf);
}

TEST(CpuDevice, WindowsOutsideTheBufferAreRefusedAtTheCall) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  DeviceBuffer buf = dev.alloc(100, BufferUsage::activations, "acts of layer 2");
  std::vector<uint8_t> host(200);
  std::string msg = message_of<Error>([&] { dev.upload(buf, 60, host.data(), 41); });
  EXPECT_THAT(msg, HasSubstr("upload"));
  EXPECT_THAT(msg, HasSubstr("acts of layer 2"));
  EXPECT_THAT(message_of<Error>([&] { dev.download(host.data(), buf, 101, 0); }),
              HasSubstr("download"));
  EXPECT_THAT(message_of<Error>([&] { dev.zero(buf, SIZE_MAX, 2); }), HasSubstr("zero"));
  dev.upload(buf, 60, host.data(), 40);  // the exact end fits
  dev.sync();
  EXPECT_EQ(dev.counters().uploads, 1);  // refused calls enqueued nothing
  dev.free(buf);
}

TEST(CpuDevice, StreamRunsManyOpsInCallOrder) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  DeviceBuffer buf = dev.alloc(8, BufferUsage::workspace, "slot");
  // Each round overwrites the same bytes, then reads them back: only call
  // order gives every read its own round's value.
  constexpr int kRounds = 300;
  std::vector<uint64_t> sent(kRounds), got(kRounds, 0);
  for (int i = 0; i < kRounds; ++i) {
    sent[size_t(i)] = 0x1234567800000000ull + uint64_t(i) * 7919;
    if (i % 3 == 0) dev.zero(buf, 0, 8);
    dev.upload(buf, 0, &sent[size_t(i)], 8);
    dev.download(&got[size_t(i)], buf, 0, 8);
  }
  dev.sync();
  EXPECT_EQ(got, sent);
  dev.free(buf);
}

TEST(CpuDevice, KernelThreadsAreTheWorkersOwn) {
  MemoryTracker tracker;
  const int host = num_threads();
  for (int threads : {1, 2, 3}) {
    CpuDeviceConfig c = small_config(tracker);
    c.threads = threads;
    CpuDevice dev(c);
    EXPECT_EQ(dev.kernel_threads(), threads);
    EXPECT_EQ(num_threads(), host);
  }
  CpuDeviceConfig bad = small_config(tracker);
  bad.threads = 0;
  EXPECT_THAT(message_of<Error>([&] { CpuDevice dev(bad); }), HasSubstr("threads >= 1"));
}

TEST(CpuDevice, InjectedAllocFaultFiresOnceOnTheNthAlloc) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  dev.inject({.fail_alloc = 1});
  DeviceBuffer a = dev.alloc(10, BufferUsage::weights, "first");
  std::string msg =
      message_of<DeviceOutOfMemory>([&] { dev.alloc(10, BufferUsage::weights, "second"); });
  EXPECT_THAT(msg, HasSubstr("injected"));
  EXPECT_THAT(msg, HasSubstr("second"));
  EXPECT_EQ(dev.used(), 10u);
  DeviceBuffer c = dev.alloc(10, BufferUsage::weights, "third");
  EXPECT_EQ(dev.used(), 20u);
  dev.free(a);
  dev.free(c);
}

TEST(CpuDevice, InjectedLaunchFaultPoisonsTheBatchUntilSync) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker, 1 << 20));
  TinyForward t(dev);
  const Graph& g = dev.compile(t.key);
  dev.sync();
  dev.reset_counters();

  dev.inject({.fail_launch = 1});
  const std::vector<float> ones(8, 1.0f);
  std::vector<float> y(8, -1.0f);
  dev.launch(g, t.args());  // runs
  dev.launch(g, t.args());  // fails when executed
  dev.upload(t.y.buffer, 0, ones.data(), 32);
  dev.download(y.data(), t.y.buffer, 0, 32);
  std::string msg = message_of<DeviceError>([&] { dev.sync(); });
  EXPECT_THAT(msg, HasSubstr("injected"));
  EXPECT_THAT(msg, HasSubstr(t.key.str()));
  EXPECT_THAT(msg, HasSubstr("2 later ops were skipped"));
  EXPECT_EQ(y, std::vector<float>(8, -1.0f));  // the download was skipped
  DeviceCounters c = dev.counters();
  EXPECT_EQ(c.launches, 1);
  EXPECT_EQ(c.uploads, 0);
  EXPECT_EQ(c.downloads, 0);

  // The next batch runs.
  dev.launch(g, t.args());
  dev.upload(t.y.buffer, 0, ones.data(), 32);
  dev.download(y.data(), t.y.buffer, 0, 32);
  dev.sync();
  EXPECT_EQ(y, ones);
  EXPECT_EQ(dev.counters().launches, 2);
  dev.sync();  // nothing pending: no error left behind
}

TEST(CpuDevice, CompileCachesByKeyAndValidates) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker));
  TinyForward t(dev);
  const Graph& g1 = dev.compile(t.key);
  const Graph& g2 = dev.compile(t.key);
  EXPECT_EQ(&g1, &g2);
  EXPECT_EQ(g1.key(), t.key);
  EXPECT_EQ(dev.compiles(), 1);
  GraphKey other = t.key;
  other.G = 4;
  EXPECT_NE(&dev.compile(other), &g1);
  EXPECT_EQ(dev.compiles(), 2);

  GraphKey bad = t.key;
  bad.G = 0;
  EXPECT_THAT(message_of<Error>([&] { dev.compile(bad); }), HasSubstr("G0"));
  bad = t.key;
  bad.dtype = static_cast<DType>(7);
  EXPECT_THAT(message_of<Error>([&] { dev.compile(bad); }), HasSubstr("dtype"));
  bad = t.key;
  bad.kind = static_cast<GraphKind>(9);
  EXPECT_THAT(message_of<Error>([&] { dev.compile(bad); }), HasSubstr("kind"));
  EXPECT_EQ(dev.compiles(), 2);
}

TEST(CpuDevice, LaunchArgumentsAreCheckedSlotBySlot) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker, 1 << 20));
  TinyForward t(dev);
  const Graph& g = dev.compile(t.key);
  const std::string key = t.key.str();
  auto refused = [&](GraphArgs args) { return message_of<Error>([&] { dev.launch(g, args); }); };

  GraphArgs missing;
  missing.set("x_GD", t.x).set("w13_FD", t.w13).set("w2_DF", t.w2).set("y_GD", t.y);
  missing.set("a_GF", t.a);
  std::string msg = refused(missing);
  EXPECT_THAT(msg, HasSubstr("missing slot 'h_G2F'"));
  EXPECT_THAT(msg, HasSubstr(key));

  GraphArgs extra = t.args();
  extra.set("score_G", t.a);  // the key does not absorb
  EXPECT_THAT(refused(extra), HasSubstr("no slot named 'score_G'"));

  GraphArgs twice = t.args();
  twice.set("x_GD", t.x);
  EXPECT_THAT(refused(twice), HasSubstr("'x_GD' is given twice"));

  DeviceTensor wrong_shape = t.x;
  wrong_shape.shape = {4, 2};
  GraphArgs shape = t.args();
  shape.tensors[0].second = wrong_shape;
  EXPECT_THAT(refused(shape), HasSubstr("slot 'x_GD' is f32[4, 2], want f32[2, 4]"));

  DeviceTensor wrong_dtype = t.y;
  wrong_dtype.dtype = DType::bf16;
  GraphArgs dtype = t.args();
  dtype.tensors[3].second = wrong_dtype;
  EXPECT_THAT(refused(dtype), HasSubstr("slot 'y_GD' is bf16[2, 4]"));

  DeviceTensor outside = t.h;
  outside.offset = 4;  // 48 bytes from byte 4 of a 48-byte buffer
  GraphArgs window = t.args();
  window.tensors[4].second = outside;
  EXPECT_THAT(refused(window), HasSubstr("slot h_G2F"));

  GraphArgs ints = t.args();
  ints.ints["sum_started"] = 1;  // forward graphs take none
  EXPECT_THAT(refused(ints), HasSubstr("sum_started"));

  MemoryTracker other_tracker;
  CpuDevice other(small_config(other_tracker, 1 << 20));
  const Graph& foreign = other.compile(t.key);
  EXPECT_THAT(message_of<Error>([&] { dev.launch(foreign, t.args()); }),
              HasSubstr("not compiled by this device"));

  dev.sync();
  EXPECT_EQ(dev.counters().launches, 0);  // nothing refused was enqueued
}

TEST(CpuDevice, CountersCountCallsPerKeyAndBytesExactly) {
  MemoryTracker tracker;
  CpuDevice dev(small_config(tracker, 1 << 20));
  TinyForward t(dev);
  GraphKey wide = t.key;
  wide.G = 1;  // the same buffers hold a 1-row window
  DeviceTensor x1 = t.x, y1 = t.y, h1 = t.h, a1 = t.a;
  x1.shape = {1, 4}, y1.shape = {1, 4}, h1.shape = {1, 6}, a1.shape = {1, 3};
  GraphArgs one;
  one.set("x_GD", x1).set("w13_FD", t.w13).set("w2_DF", t.w2).set("y_GD", y1).set("h_G2F", h1);
  one.set("a_GF", a1);
  const Graph& g2 = dev.compile(t.key);
  const Graph& g1 = dev.compile(wide);
  dev.sync();
  dev.reset_counters();

  std::vector<float> host(8, 0.5f);
  for (int i = 0; i < 3; ++i) dev.launch(g2, t.args());
  for (int i = 0; i < 2; ++i) dev.launch(g1, one);
  dev.upload(t.x.buffer, 0, host.data(), 32);
  dev.upload(t.x.buffer, 8, host.data(), 12);
  dev.download(host.data(), t.y.buffer, 4, 28);
  dev.zero(t.h.buffer, 0, 48);
  dev.sync();

  DeviceCounters c = dev.counters();
  EXPECT_EQ(c.launches, 5);
  EXPECT_EQ(c.calls.size(), 2u);
  EXPECT_EQ(c.calls[t.key.str()], 3);
  EXPECT_EQ(c.calls[wide.str()], 2);
  EXPECT_EQ(c.uploads, 2);
  EXPECT_EQ(c.bytes_up, 44u);
  EXPECT_EQ(c.downloads, 1);
  EXPECT_EQ(c.bytes_down, 28u);
  EXPECT_GT(c.compute_s, 0.0);
  EXPECT_GT(c.transfer_s, 0.0);
  EXPECT_GE(c.busy_s, c.compute_s);
  EXPECT_GE(c.busy_s, c.transfer_s);

  dev.reset_counters();
  c = dev.counters();
  EXPECT_EQ(c.launches, 0);
  EXPECT_TRUE(c.calls.empty());
  EXPECT_EQ(c.bytes_up, 0u);
  EXPECT_EQ(c.busy_s, 0.0);
}

}  // namespace
}  // namespace tiermoe
