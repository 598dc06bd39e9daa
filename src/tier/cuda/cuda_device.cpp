#include "cuda_device.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "../device_pool.h"
#include "../expert_plan.h"
#include "../stream_hazards.h"
#include "cublas_library.h"
#include "cuda_check.h"
#include "cuda_graph.h"
#include "cuda_staging.h"

namespace tiermoe::cuda {

namespace {

using detail::str_of;

constexpr const char* kWhere = "CudaDevice";
// cuBLAS's recommended workspace on Hopper.
constexpr size_t kBlasWorkspace = size_t(32) << 20;
constexpr size_t kStagingChunk = size_t(4) << 20;
// Argument blocks in flight: each is a few hundred bytes, reused once the
// copy that read it has run.
constexpr size_t kArgSlots = 1024, kArgSlotBytes = 512;
// cuBLAS reads matrices 16 bytes at a time.
constexpr size_t kGraphArgAlign = 16;

// The arena holds the budget plus the pool's rounding: 1/64 of it, 1 MiB at least.
size_t arena_bytes(size_t budget) {
  return DevicePool::rounded(budget + std::max(budget / 64, size_t(1) << 20));
}

using OpKind = DeviceLedger::Op;

Lane lane_of(OpKind k) {
  switch (k) {
    case OpKind::upload:
    case OpKind::zero:
      return Lane::up;
    case OpKind::launch:
      return Lane::compute;
    case OpKind::download:
      return Lane::down;
  }
  __builtin_unreachable();
}

}  // namespace

struct CudaDevice::Impl {
  struct Buffer {
    size_t offset = 0, bytes = 0;
    BufferUsage usage = BufferUsage::workspace;
    std::string what;
  };
  struct Op {
    OpKind kind = OpKind::upload;
    size_t bytes = 0;
    const char* src = nullptr;  // upload
    char* dst = nullptr;        // download
    char* device = nullptr;     // the window's device address (transfers)
    const CudaExpertGraph* graph = nullptr;
    std::vector<uint64_t> slot_addresses;
    bool sum_started = false;
    std::vector<MemAccess> accesses;
    bool injected = false;
  };
  // An issued op's events, settled into the counters at sync().
  struct Timed {
    OpKind kind;
    size_t bytes;
    const CudaExpertGraph* graph;
    cudaEvent_t start, end;
  };
  struct Landing {
    PinnedChunks::Chunk* chunk;
    char* dst;
    size_t bytes;
  };

  CudaDeviceConfig cfg;
  std::string name;
  char* arena = nullptr;
  size_t arena_size = 0;
  DevicePool pool{0};
  cudaStream_t lanes[kLanes] = {};
  cudaStream_t capture = nullptr;
  BlasContext blas;
  std::unique_ptr<PinnedChunks> up_chunks, down_chunks, arg_slots;

  mutable std::mutex mu;  // everything below
  std::condition_variable work_cv, idle_cv, landing_cv, chunk_cv;
  std::unordered_map<uint64_t, Buffer> buffers;
  uint64_t next_id = 1;
  size_t used = 0;
  std::deque<Op> queue;
  bool feeding = false, stop = false, stop_lander = false;
  std::deque<Landing> landings;
  int64_t landings_open = 0;  // pushed and not yet copied out
  bool failed = false;
  std::string failure;
  int64_t skipped = 0;
  DeviceLedger ledger;
  std::map<GraphKey, std::unique_ptr<CudaExpertGraph>> graphs;
  int64_t compiles = 0;
  size_t graph_bytes = 0;

  // Touched only by the feeder while it issues, and by quiesce() once it is idle.
  StreamHazards hazards;
  uint64_t seq = 0;
  std::unordered_map<uint64_t, cudaEvent_t> op_end;
  std::vector<Timed> timed;
  EventPool events;

  std::mutex compile_mu;
  std::thread feeder, lander;

  ~Impl();
  void set_device() const { TIERMOE_CUDA(cudaSetDevice(cfg.ordinal), name); }
  void fail(const std::string& what) {
    if (failed) return;
    failed = true;
    failure = what;
  }

  void feeder_main();
  void lander_main();
  void issue(Op& op);
  void issue_upload(const Op& op);
  void issue_download(const Op& op);
  void issue_launch(const Op& op);
  // Waits for every queued op to have run (host buffers included); settles
  // the counters; errors are kept for sync().
  void quiesce(std::unique_lock<std::mutex>& lk);
  void settle_timings();

  char* window(const DeviceBuffer& b, size_t offset, size_t bytes, std::string_view op) const;
  void enqueue(Op op) {
    queue.push_back(std::move(op));
    work_cv.notify_one();
  }
};

// Also what a constructor that threw leaves behind. Waits for the op in
// progress and discards the rest (their host pointers need only live until a
// sync() that will never come). Teardown cannot report errors.
CudaDevice::Impl::~Impl() {
  {
    std::lock_guard lk(mu);
    stop = true;
    queue.clear();
  }
  work_cv.notify_all();
  if (feeder.joinable()) feeder.join();
  for (cudaStream_t s : lanes) {
    if (s) cudaStreamSynchronize(s);
  }
  {
    std::lock_guard lk(mu);
    stop_lander = true;
  }
  landing_cv.notify_all();
  if (lander.joinable()) lander.join();
  graphs.clear();
  up_chunks.reset(), down_chunks.reset(), arg_slots.reset();
  if (blas.handle) CublasLibrary::get().destroy(blas.handle);
  if (blas.workspace) cudaFree(blas.workspace);
  for (cudaStream_t s : lanes) {
    if (s) cudaStreamDestroy(s);
  }
  if (capture) cudaStreamDestroy(capture);
  for (auto& [id, b] : buffers) cfg.tracker->on_free(MemTag::device, b.bytes);
  if (arena) cudaFree(arena);
}

void CudaDevice::Impl::feeder_main() {
  std::unique_lock lk(mu);
  try {
    set_device();
  } catch (const std::exception& e) {
    fail(e.what());
  }
  for (;;) {
    work_cv.wait(lk, [&] { return stop || !queue.empty(); });
    if (stop) return;
    Op op = std::move(queue.front());
    queue.pop_front();
    if (failed) {
      ++skipped;  // a stream is poisoned after a failure, as on the CPU device
    } else {
      feeding = true;
      lk.unlock();
      std::string error;
      try {
        issue(op);
      } catch (const std::exception& e) {
        error = e.what();
      }
      lk.lock();
      feeding = false;
      if (!error.empty()) {
        fail(str_of("device ", name, ": ",
                    op.kind == OpKind::launch ? "launch of " + op.graph->name() : "a transfer",
                    " failed: ", error));
      }
    }
    if (queue.empty()) idle_cv.notify_all();
  }
}

void CudaDevice::Impl::lander_main() {
  std::unique_lock lk(mu);
  try {
    set_device();
  } catch (const std::exception& e) {
    fail(e.what());
  }
  for (;;) {
    landing_cv.wait(lk, [&] { return stop_lander || !landings.empty(); });
    if (stop_lander) return;  // the rest is discarded: its host buffers may be gone
    const Landing l = landings.front();
    landings.pop_front();
    lk.unlock();
    const cudaError_t e = cudaEventSynchronize(l.chunk->done);
    if (e == cudaSuccess) std::memcpy(l.dst, l.chunk->ptr, l.bytes);
    lk.lock();
    if (e != cudaSuccess) {
      fail(str_of("device ", name, ": a download failed: ", cudaGetErrorName(e), " (",
                  cudaGetErrorString(e), ")"));
    }
    l.chunk->landing = false;
    --landings_open;
    chunk_cv.notify_all();
  }
}

void CudaDevice::Impl::issue(Op& op) {
  if (op.injected) throw DeviceError("injected fault (DeviceFaults::fail_launch)");
  const Lane lane = lane_of(op.kind);
  cudaStream_t s = lanes[size_t(lane)];
  const uint64_t id = ++seq;
  const LaneWaits waits = hazards.add(id, lane, op.accesses);
  for (int l = 0; l < kLanes; ++l) {
    if (waits[size_t(l)])
      TIERMOE_CUDA(cudaStreamWaitEvent(s, op_end.at(waits[size_t(l)]), 0), name);
  }
  const Timed t{op.kind, op.bytes, op.graph, events.take(), events.take()};
  TIERMOE_CUDA(cudaEventRecord(t.start, s), name);
  switch (op.kind) {
    case OpKind::upload:
      issue_upload(op);
      break;
    case OpKind::download:
      issue_download(op);
      break;
    case OpKind::zero:
      TIERMOE_CUDA(cudaMemsetAsync(op.device, 0, op.bytes, s), name);
      break;
    case OpKind::launch:
      issue_launch(op);
      break;
  }
  TIERMOE_CUDA(cudaEventRecord(t.end, s), name);
  op_end[id] = t.end;
  timed.push_back(t);
}

// Host bytes into a pinned chunk (once its previous DMA has read it), then DMA.
void CudaDevice::Impl::issue_upload(const Op& op) {
  cudaStream_t s = lanes[size_t(Lane::up)];
  for (size_t done = 0; done < op.bytes;) {
    const size_t n = std::min(up_chunks->chunk_bytes(), op.bytes - done);
    PinnedChunks::Chunk& c = up_chunks->next();
    if (c.recorded) TIERMOE_CUDA(cudaEventSynchronize(c.done), name);
    std::memcpy(c.ptr, op.src + done, n);
    TIERMOE_CUDA(cudaMemcpyAsync(op.device + done, c.ptr, n, cudaMemcpyHostToDevice, s), name);
    TIERMOE_CUDA(cudaEventRecord(c.done, s), name);
    c.recorded = true;
    done += n;
  }
}

// DMA into a pinned chunk (once the lander has emptied it); the lander copies
// it to the caller's buffer when the DMA is done.
void CudaDevice::Impl::issue_download(const Op& op) {
  cudaStream_t s = lanes[size_t(Lane::down)];
  for (size_t done = 0; done < op.bytes;) {
    const size_t n = std::min(down_chunks->chunk_bytes(), op.bytes - done);
    PinnedChunks::Chunk* c = &down_chunks->next();
    {
      std::unique_lock lk(mu);
      chunk_cv.wait(lk, [&] { return !c->landing; });
    }
    TIERMOE_CUDA(cudaMemcpyAsync(c->ptr, op.device + done, n, cudaMemcpyDeviceToHost, s), name);
    TIERMOE_CUDA(cudaEventRecord(c->done, s), name);
    std::lock_guard lk(mu);
    c->landing = true;
    landings.push_back(Landing{c, op.dst + done, n});
    ++landings_open;
    landing_cv.notify_one();
    done += n;
  }
}

// The argument block goes up on the compute stream right before the replay,
// so a launch never sees the next one's pointers.
void CudaDevice::Impl::issue_launch(const Op& op) {
  cudaStream_t s = lanes[size_t(Lane::compute)];
  const CudaExpertGraph& g = *op.graph;
  const ExpertPlan& plan = g.plan();
  PinnedChunks::Chunk& slot = arg_slots->next();
  if (slot.recorded) TIERMOE_CUDA(cudaEventSynchronize(slot.done), name);
  write_arg_block(plan, op.slot_addresses, g.scratch(), op.sum_started, slot.ptr);
  TIERMOE_CUDA(cudaMemcpyAsync(g.arg_block(), slot.ptr, plan.arg_bytes, cudaMemcpyHostToDevice, s),
               name);
  TIERMOE_CUDA(cudaEventRecord(slot.done, s), name);
  slot.recorded = true;
  TIERMOE_CUDA(cudaGraphLaunch(g.exec(), s), name);
}

void CudaDevice::Impl::quiesce(std::unique_lock<std::mutex>& lk) {
  idle_cv.wait(lk, [&] { return queue.empty() && !feeding; });
  for (cudaStream_t s : lanes) {
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
      fail(str_of("device ", name, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
    }
  }
  chunk_cv.wait(lk, [&] { return landings_open == 0; });
  settle_timings();
}

void CudaDevice::Impl::settle_timings() {
  if (!timed.empty()) {
    std::vector<std::pair<double, double>> busy;
    const cudaEvent_t origin = timed.front().start;
    for (const Timed& t : timed) {
      float begin_ms = 0, length_ms = 0;
      if (cudaEventElapsedTime(&begin_ms, origin, t.start) != cudaSuccess ||
          cudaEventElapsedTime(&length_ms, t.start, t.end) != cudaSuccess) {
        continue;  // not run (a failure poisoned the stream): not counted
      }
      const double seconds = double(length_ms) * 1e-3;
      busy.emplace_back(double(begin_ms) * 1e-3, double(begin_ms) * 1e-3 + seconds);
      ledger.count(t.kind, t.bytes, t.graph ? t.graph->name() : "", seconds);
    }
    ledger.add_busy(covered_seconds(std::move(busy)));
  }
  for (const Timed& t : timed) {
    events.give_back(t.start);
    events.give_back(t.end);
  }
  timed.clear();
  op_end.clear();
  hazards.clear();
}

char* CudaDevice::Impl::window(const DeviceBuffer& b, size_t offset, size_t bytes,
                               std::string_view op) const {
  auto it = buffers.find(b.id);
  TIERMOE_CHECK(it != buffers.end(),
                str_of(op, ": buffer #", b.id, " is not a live buffer of this device"), name,
                "allocate buffers with this device's alloc() and stop using them after free()");
  const Buffer& buf = it->second;
  TIERMOE_CHECK(offset <= buf.bytes && bytes <= buf.bytes - offset,
                str_of(op, ": ", bytes, " bytes at offset ", offset, " do not fit buffer #", b.id,
                       " (", buf.what, ", ", buf.bytes, " bytes)"),
                name, "keep offset + bytes within the buffer");
  return arena + buf.offset + offset;
}

CudaDevice::CudaDevice(const CudaDeviceConfig& cfg) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.cfg = cfg;
  d.name = str_of("cuda:", cfg.ordinal);
  TIERMOE_CHECK(cfg.memory_bytes > 0, "a CUDA device needs a memory budget", d.name,
                "give the device tier's budget, e.g. --device-memory 20GiB");
  TIERMOE_CHECK(cfg.tracker, "CudaDevice needs a memory tracker", d.name,
                "leave it at MemoryTracker::process() or pass a test's own");
  d.set_device();
  d.arena_size = arena_bytes(cfg.memory_bytes);
  if (cudaMalloc(reinterpret_cast<void**>(&d.arena), d.arena_size) != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    throw Error(str_of("device ", d.name, " cannot take the budget of ", cfg.memory_bytes,
                       " bytes (", d.arena_size, " with the pool's slack): the GPU has ",
                       free_bytes, " of ", total, " bytes free"),
                "--device-memory", "lower --device-memory, or free the GPU of other processes");
  }
  d.pool = DevicePool(d.arena_size);
  for (cudaStream_t& s : d.lanes)
    TIERMOE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), d.name);
  TIERMOE_CUDA(cudaStreamCreateWithFlags(&d.capture, cudaStreamNonBlocking), d.name);
  const auto& lib = CublasLibrary::get();
  check_cublas(lib.create(&d.blas.handle), "cublasCreate", kWhere);
  // Default math: f32 GEMMs stay f32 (no TF32), as the f32 tolerance needs.
  check_cublas(lib.set_math_mode(d.blas.handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode", kWhere);
  TIERMOE_CUDA(cudaMalloc(&d.blas.workspace, kBlasWorkspace), d.name);
  d.blas.workspace_bytes = kBlasWorkspace;
  const size_t chunks = std::max<size_t>(2, cfg.staging_bytes / kStagingChunk);
  d.up_chunks = std::make_unique<PinnedChunks>(chunks, kStagingChunk, "upload staging");
  d.down_chunks = std::make_unique<PinnedChunks>(chunks, kStagingChunk, "download staging");
  d.arg_slots = std::make_unique<PinnedChunks>(kArgSlots, kArgSlotBytes, "launch arguments");
  d.feeder = std::thread([&d] { d.feeder_main(); });
  d.lander = std::thread([&d] { d.lander_main(); });
}

CudaDevice::~CudaDevice() = default;

std::string CudaDevice::name() const { return impl_->name; }

size_t CudaDevice::capacity() const { return impl_->cfg.memory_bytes; }

size_t CudaDevice::used() const {
  std::lock_guard lk(impl_->mu);
  return impl_->used;
}

DeviceBuffer CudaDevice::alloc(size_t bytes, BufferUsage usage, std::string_view what) {
  Impl& d = *impl_;
  TIERMOE_CHECK(bytes > 0, str_of("alloc of 0 bytes for ", what), d.name,
                "a device buffer needs at least one byte; skip the allocation instead");
  std::lock_guard lk(d.mu);
  const bool injected = d.ledger.alloc_fault_fires();
  const size_t capacity = d.cfg.memory_bytes;
  const std::string head = str_of(injected ? "injected fault (DeviceFaults::fail_alloc): " : "",
                                  "device ", d.name, " is out of memory: ", what, " (",
                                  buffer_usage_name(usage), ") asks for ", bytes, " bytes, ");
  if (injected || bytes > capacity - d.used) {
    throw DeviceOutOfMemory(str_of(head, d.used, " of the ", capacity, "-byte budget are in use"),
                            kWhere, "raise --device-memory or keep fewer experts resident");
  }
  const std::optional<size_t> offset = d.pool.allocate(bytes);
  if (!offset) {
    throw DeviceOutOfMemory(str_of(head, "and the arena's largest free block is ",
                                   d.pool.largest_free(), " bytes (fragmented)"),
                            kWhere, "raise --device-memory a little: the pool needs some slack");
  }
  const uint64_t id = d.next_id++;
  d.buffers.emplace(id, Impl::Buffer{*offset, bytes, usage, std::string(what)});
  d.used += bytes;
  d.cfg.tracker->on_alloc(MemTag::device, bytes);
  return DeviceBuffer{id, bytes, usage};
}

void CudaDevice::free(DeviceBuffer& buf) {
  if (!buf.valid()) return;
  Impl& d = *impl_;
  std::unique_lock lk(d.mu);
  TIERMOE_CHECK(d.buffers.count(buf.id),
                str_of("free: buffer #", buf.id, " is not a live buffer of this device"), d.name,
                "free each buffer once, on the device that allocated it");
  d.quiesce(lk);
  auto it = d.buffers.find(buf.id);
  if (it == d.buffers.end()) return;  // another host thread freed it meanwhile
  d.pool.release(it->second.offset);
  d.used -= it->second.bytes;
  d.cfg.tracker->on_free(MemTag::device, it->second.bytes);
  d.buffers.erase(it);
  buf = DeviceBuffer{};
}

void CudaDevice::upload(const DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) {
  Impl& d = *impl_;
  TIERMOE_CHECK(src || bytes == 0, "upload: null host pointer", d.name, "pass the source bytes");
  std::lock_guard lk(d.mu);
  Impl::Op op;
  op.kind = OpKind::upload;
  op.bytes = bytes;
  op.src = static_cast<const char*>(src);
  op.device = d.window(dst, offset, bytes, "upload");
  op.accesses = {MemAccess{dst.id, offset, offset + bytes, /*write=*/true}};
  d.enqueue(std::move(op));
}

void CudaDevice::download(void* dst, const DeviceBuffer& src, size_t offset, size_t bytes) {
  Impl& d = *impl_;
  TIERMOE_CHECK(dst || bytes == 0, "download: null host pointer", d.name,
                "pass where the bytes go");
  std::lock_guard lk(d.mu);
  Impl::Op op;
  op.kind = OpKind::download;
  op.bytes = bytes;
  op.dst = static_cast<char*>(dst);
  op.device = d.window(src, offset, bytes, "download");
  op.accesses = {MemAccess{src.id, offset, offset + bytes, /*write=*/false}};
  d.enqueue(std::move(op));
}

void CudaDevice::zero(const DeviceBuffer& dst, size_t offset, size_t bytes) {
  Impl& d = *impl_;
  std::lock_guard lk(d.mu);
  Impl::Op op;
  op.kind = OpKind::zero;
  op.bytes = bytes;
  op.device = d.window(dst, offset, bytes, "zero");
  op.accesses = {MemAccess{dst.id, offset, offset + bytes, /*write=*/true}};
  d.enqueue(std::move(op));
}

const Graph& CudaDevice::compile(const GraphKey& key) {
  Impl& d = *impl_;
  // holds_quantized() is false: the tier uploads quantized experts widened.
  TIERMOE_CHECK(!key.quant,
                "device " + d.name + " has no graphs over quantized weights: " + key.str(), kWhere,
                "upload the experts widened to the compute dtype");
  std::lock_guard compiling(d.compile_mu);
  {
    std::lock_guard lk(d.mu);
    auto it = d.graphs.find(key);
    if (it != d.graphs.end()) return *it->second;
  }
  d.set_device();
  std::unique_ptr<CudaExpertGraph> graph;
  try {
    graph = std::make_unique<CudaExpertGraph>(key, d.blas, d.capture);
    // Loads the graph onto the GPU now, so its first launch pays no upload.
    TIERMOE_CUDA(cudaGraphUpload(graph->exec(), d.lanes[size_t(Lane::compute)]), d.name);
  } catch (const DeviceError& e) {
    throw DeviceError(str_of("device ", d.name, ": compiling ", key.str(), " failed: ", e.what()),
                      kWhere, e.hint());
  }
  TIERMOE_CHECK(graph->plan().arg_bytes <= kArgSlotBytes,
                str_of("the argument block of ", key.str(), " is ", graph->plan().arg_bytes,
                       " bytes, past the device's ", kArgSlotBytes),
                kWhere, "this is a TierMoE bug; please report it");
  std::lock_guard lk(d.mu);
  ++d.compiles;
  d.graph_bytes += graph->device_bytes();
  return *d.graphs.emplace(key, std::move(graph)).first->second;
}

void CudaDevice::launch(const Graph& graph, GraphArgs args) {
  Impl& d = *impl_;
  std::lock_guard lk(d.mu);
  auto it = d.graphs.find(graph.key());
  TIERMOE_CHECK(it != d.graphs.end() && it->second.get() == &graph,
                "launch: graph " + graph.key().str() + " was not compiled by this device", d.name,
                "launch graphs that this device's compile() returned");
  const CudaExpertGraph& g = *it->second;
  auto buffer_bytes = [&](uint64_t id) -> std::optional<size_t> {
    auto b = d.buffers.find(id);
    if (b == d.buffers.end()) return std::nullopt;
    return b->second.bytes;
  };
  BoundLaunch bound = bind_launch(g.plan(), args, buffer_bytes, kGraphArgAlign, d.name);
  Impl::Op op;
  op.kind = OpKind::launch;
  op.graph = &g;
  for (const BoundSlot& s : bound.slots) {
    op.slot_addresses.push_back(
        uint64_t(reinterpret_cast<uintptr_t>(d.arena + d.buffers.at(s.buffer).offset + s.offset)));
  }
  op.sum_started = bound.sum_started;
  op.accesses = std::move(bound.accesses);
  op.injected = d.ledger.launch_fault_fires();
  d.enqueue(std::move(op));
}

void CudaDevice::sync() {
  Impl& d = *impl_;
  std::unique_lock lk(d.mu);
  d.quiesce(lk);
  if (!d.failed) return;
  std::string what = d.failure;
  if (d.skipped > 0) what += str_of(" (", d.skipped, " later ops were skipped)");
  d.failed = false;
  d.failure.clear();
  d.skipped = 0;
  throw DeviceError(what, "CudaDevice stream",
                    "the failure is cleared: new work runs again; redo the skipped work");
}

DeviceCounters CudaDevice::counters() const {
  std::lock_guard lk(impl_->mu);
  return impl_->ledger.counters();
}

void CudaDevice::reset_counters() {
  std::lock_guard lk(impl_->mu);
  impl_->ledger.reset_counters();
}

void CudaDevice::inject(const DeviceFaults& faults) {
  std::lock_guard lk(impl_->mu);
  impl_->ledger.inject(faults);
}

int64_t CudaDevice::compiles() const {
  std::lock_guard lk(impl_->mu);
  return impl_->compiles;
}

size_t CudaDevice::overhead_bytes() const {
  std::lock_guard lk(impl_->mu);
  const Impl& d = *impl_;
  return (d.arena_size - d.cfg.memory_bytes) + d.blas.workspace_bytes + d.graph_bytes;
}

}  // namespace tiermoe::cuda
