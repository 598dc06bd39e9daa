#pragma once
// Device: the only door to accelerator memory and compute (docs/architecture.md,
// "The device tier"). Memory is buffers with a usage tag, allocated under a byte
// budget; work is a single in-order stream of uploads, downloads, zero fills
// and graph launches that the host enqueues and later waits for with sync().
// Graphs are compiled once per GraphKey and cached, so a handful of fixed
// shapes (one per bucket of rows) serve every step.
//
// The interface knows graphs by key and arguments by name, not experts: the
// expert graphs are the first kinds; a later step can add the dense path
// (attention, norms, router) as more kinds behind the same calls.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tiermoe/core/dtype.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/tensor.h"
#include "tiermoe/moe/experts.h"

namespace tiermoe {

// The budget would be exceeded (or an injected fault says so). Nothing was
// allocated; the caller may free something, or run the work on the host.
class DeviceOutOfMemory : public Error {
 public:
  using Error::Error;
};

// A launch or transfer failed on the device. The stream is drained: sync()
// throws this once, later work runs again.
class DeviceError : public Error {
 public:
  using Error::Error;
};

enum class BufferUsage : uint8_t { weights, grads, activations, workspace };
std::string_view buffer_usage_name(BufferUsage u);

// A handle to device memory; copying it does not copy or own the memory.
struct DeviceBuffer {
  uint64_t id = 0;  // 0: none
  size_t bytes = 0;
  BufferUsage usage = BufferUsage::workspace;
  bool valid() const { return id != 0; }
};

// A typed window into a buffer, as graph arguments take them.
struct DeviceTensor {
  DeviceBuffer buffer;
  size_t offset = 0;  // bytes
  Shape shape;
  DType dtype = DType::f32;
  size_t nbytes() const { return size_t(shape_numel(shape)) * dtype_size(dtype); }
};

enum class GraphKind : uint8_t { expert_fwd, expert_bwd_dx, expert_bwd_dx_dw };
std::string_view graph_kind_name(GraphKind k);

// What a compiled graph is specialised on. The expert graphs compute exactly
// G rows of one expert (rows past the caller's count are zero padding with
// score 0, which adds nothing anywhere: moe/expert_math.h).
struct GraphKey {
  GraphKind kind = GraphKind::expert_fwd;
  int64_t D = 0, F = 0, G = 0;
  DType dtype = DType::f32;
  ExpertActivation activation = ExpertActivation::swiglu;
  bool absorb = true;  // router scores multiplied into the activation before W2
  bool bias = false;   // b13, b2 (GPT-OSS)
  GptOssActivation gpt_oss{};  // the clamped activation's alpha and limit (gpt_oss only)
  // Frozen weights held at their stored width (kernels/quant_image.h): the
  // graph decodes them into the w13_FD and w2_DF slots and computes from
  // those. Forward and dx graphs only (a quantized expert trains no weights).
  std::optional<ExpertQuant> quant;
  auto operator<=>(const GraphKey&) const = default;
  std::string str() const;  // "expert_fwd D2048 F768 G128 bf16 swiglu absorb"
};

// Named arguments of one launch. Expert graphs (G rows, slot names below):
// W13 and W2 are w13_FD and w2_DF in the compute dtype, or with a quant
// layout the images w13_q and w2_q (f32 words standing for bytes,
// quant_image().words() of them) and w13_FD, w2_DF the scratch the graph
// decodes them into (rewritten by every launch).
//   expert_fwd        in  x_GD, w13_FD, w2_DF [, score_G if absorb] [, b13_F, b2_D if bias]
//                     out y_GD, h_G2F, a_GF (a unscaled, as the host saves it)
//   expert_bwd_dx     in  dy_GD, h_G2F, w13_FD, w2_DF [, a_GF, score_G if absorb]
//                         [, b13_F, b2_D if bias]
//                     out dx_GD [, dscore_G if absorb]
//   expert_bwd_dx_dw  in  as expert_bwd_dx, plus x_GD and a_GF
//                     out as expert_bwd_dx, plus the weight-gradient sums
//                         dw13_FD, dw2_DF [, db13_F, db2_D if bias] in the grad
//                         dtype, continued when ints["sum_started"] is 1,
//                         started otherwise (moe/expert_math.h's rule)
struct GraphArgs {
  std::vector<std::pair<std::string, DeviceTensor>> tensors;
  std::map<std::string, int64_t> ints;
  GraphArgs& set(std::string name, DeviceTensor t) {
    tensors.emplace_back(std::move(name), std::move(t));
    return *this;
  }
  const DeviceTensor* find(std::string_view name) const;
};

// A compiled graph; the device that compiled it owns it.
class Graph {
 public:
  explicit Graph(GraphKey key) : key_(key) {}
  virtual ~Graph() = default;
  const GraphKey& key() const { return key_; }

 private:
  GraphKey key_;
};

struct DeviceCounters {
  std::map<std::string, int64_t> calls;  // launches per GraphKey::str()
  int64_t launches = 0;
  int64_t uploads = 0, downloads = 0;
  size_t bytes_up = 0, bytes_down = 0;
  double busy_s = 0;      // the stream running anything
  double compute_s = 0;   // of which launches
  double transfer_s = 0;  // of which uploads, downloads and zero fills
};

// Faults a test injects: the n-th allocation / launch from now (0 = the next
// one) fails with DeviceOutOfMemory / DeviceError. -1: none.
struct DeviceFaults {
  int64_t fail_alloc = -1;
  int64_t fail_launch = -1;
};

// The bookkeeping every backend keeps the same way: the counters of what its
// stream executed and the faults a test injected. The device holds it under
// its own lock. Busy time is the backend's to add (its lanes may overlap).
class DeviceLedger {
 public:
  enum class Op { upload, download, zero, launch };
  // One op the stream executed in `seconds`; `graph` names a launch's graph.
  void count(Op op, size_t bytes, std::string_view graph, double seconds);
  void add_busy(double seconds) { counters_.busy_s += seconds; }
  // Consume one step of the injected countdowns: true when the fault fires now.
  bool alloc_fault_fires() { return fires(faults_.fail_alloc); }
  bool launch_fault_fires() { return fires(faults_.fail_launch); }

  const DeviceCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = DeviceCounters{}; }
  void inject(const DeviceFaults& faults) { faults_ = faults; }

 private:
  static bool fires(int64_t& countdown) { return countdown >= 0 && countdown-- == 0; }
  DeviceCounters counters_;
  DeviceFaults faults_;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"

  // Memory. capacity() is the budget; used() what live buffers hold.
  virtual size_t capacity() const = 0;
  virtual size_t used() const = 0;
  // Throws DeviceOutOfMemory (naming `what` and the budget) past capacity().
  virtual DeviceBuffer alloc(size_t bytes, BufferUsage usage, std::string_view what) = 0;
  // Waits for queued work, then releases the buffer; `buf` becomes invalid.
  virtual void free(DeviceBuffer& buf) = 0;

  // The stream: each call enqueues and returns; work runs in call order.
  // Host memory passed in must stay valid and unchanged until sync().
  virtual void upload(const DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const DeviceBuffer& src, size_t offset, size_t bytes) = 0;
  virtual void zero(const DeviceBuffer& dst, size_t offset, size_t bytes) = 0;
  // Compiles (or finds in the cache) the graph for `key`; synchronous.
  virtual const Graph& compile(const GraphKey& key) = 0;
  virtual void launch(const Graph& graph, GraphArgs args) = 0;
  // Waits for everything enqueued; rethrows the first failure among it.
  virtual void sync() = 0;

  // Whether graphs with a quant layout compile here (frozen experts then stay
  // at their stored width in device memory; else they are uploaded widened).
  virtual bool holds_quantized() const { return false; }

  virtual DeviceCounters counters() const = 0;
  virtual void reset_counters() = 0;
  virtual void inject(const DeviceFaults& faults) = 0;
};

// Typed transfer helpers: a host tensor's bytes to/from the start of a device
// window of the same dtype (a tensor of M rows into a window of G >= M rows).
void upload_tensor(Device& dev, const DeviceTensor& dst, const Tensor& src);
void download_tensor(Device& dev, Tensor& dst, const DeviceTensor& src);

}  // namespace tiermoe
