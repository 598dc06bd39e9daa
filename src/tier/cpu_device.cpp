#include "tiermoe/tier/cpu_device.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "expert_graphs.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/core/timer.h"

namespace tiermoe {

namespace {

constexpr size_t kAlign = 64;  // AMX / AVX-512 loads, as host tensors
constexpr const char* kWhere = "CpuDevice";

}  // namespace

struct CpuDevice::Impl {
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
    BufferUsage usage = BufferUsage::workspace;
    std::string what;
  };

  using OpKind = DeviceLedger::Op;
  struct Op {
    OpKind kind = OpKind::upload;
    size_t bytes = 0;                    // transfers
    const ExpertGraph* graph = nullptr;  // launches and warm-ups
    std::function<void()> body;
    bool injected = false;               // an injected launch fault
    // Set for a compile's warm-up, which reports here (not to sync()) and
    // is not counted.
    std::promise<void>* done = nullptr;
  };

  CpuDeviceConfig cfg;

  mutable std::mutex mu;  // everything below
  std::condition_variable work_cv, idle_cv;
  std::unordered_map<uint64_t, Buffer> buffers;
  uint64_t next_id = 1;
  size_t used = 0;
  std::deque<Op> queue;
  bool running = false, stop = false;
  // The first failure since the last sync(), and the ops skipped after it.
  bool failed = false;
  std::string failure;
  int64_t skipped = 0;
  DeviceLedger ledger;
  std::map<GraphKey, std::unique_ptr<ExpertGraph>> graphs;
  int64_t compiles = 0;
  int kernel_threads = 0;

  std::mutex compile_mu;  // one compile at a time; held while its warm-up runs
  std::thread worker;

  void worker_main(std::promise<int>& started);
  void run_one(std::unique_lock<std::mutex>& lk, Op op);

  void enqueue(Op op) {
    queue.push_back(std::move(op));
    work_cv.notify_one();
  }
  void drain(std::unique_lock<std::mutex>& lk) {
    idle_cv.wait(lk, [&] { return queue.empty() && !running; });
  }
  // The host address of [offset, offset + bytes) of a live buffer; Error naming `op`.
  char* window(const DeviceBuffer& b, size_t offset, size_t bytes, std::string_view op) const;
  const ExpertGraph& own_graph(const Graph& graph) const;
  ExpertLaunch bind(const ExpertGraph& g, const GraphArgs& args) const;
};

void CpuDevice::Impl::worker_main(std::promise<int>& started) {
  // OpenMP's thread count is a per-thread setting (the nthreads ICV), so this
  // sets the worker's kernels (our parallel_for and oneDNN alike) without
  // touching the host thread's.
  set_num_threads(cfg.threads);
  started.set_value(num_threads());
  std::unique_lock lk(mu);
  for (;;) {
    work_cv.wait(lk, [&] { return stop || !queue.empty(); });
    if (stop) return;
    Op op = std::move(queue.front());
    queue.pop_front();
    run_one(lk, std::move(op));
    if (queue.empty() && !running) idle_cv.notify_all();
  }
}

// Runs one op with `lk` released; failures of stream ops are kept for sync().
void CpuDevice::Impl::run_one(std::unique_lock<std::mutex>& lk, Op op) {
  if (failed && !op.done) {
    ++skipped;  // a real stream is poisoned after a failure
    return;
  }
  running = true;
  lk.unlock();
  const auto t0 = Clock::now();
  std::string error;
  std::exception_ptr exception;
  try {
    if (op.injected) throw DeviceError("injected fault (DeviceFaults::fail_launch)");
    op.body();
  } catch (const std::exception& e) {
    error = e.what();
    exception = std::current_exception();
  } catch (...) {
    error = "unknown exception";
    exception = std::current_exception();
  }
  const double seconds = seconds_since(t0);
  lk.lock();
  running = false;
  if (op.done) {
    if (exception)
      op.done->set_exception(exception);
    else
      op.done->set_value();
  } else if (exception) {
    failed = true;
    failure = detail::str_of("device cpu: launch of ", op.graph->name(), " failed: ", error);
  } else {
    ledger.add_busy(seconds);
    ledger.count(op.kind, op.bytes, op.graph ? op.graph->name() : "", seconds);
  }
}

char* CpuDevice::Impl::window(const DeviceBuffer& b, size_t offset, size_t bytes,
                              std::string_view op) const {
  auto it = buffers.find(b.id);
  TIERMOE_CHECK(it != buffers.end(),
                detail::str_of(op, ": buffer #", b.id, " is not a live buffer of this device"),
                kWhere,
                "allocate buffers with this device's alloc() and stop using them after free()");
  const Buffer& buf = it->second;
  TIERMOE_CHECK(offset <= buf.bytes && bytes <= buf.bytes - offset,
                detail::str_of(op, ": ", bytes, " bytes at offset ", offset, " do not fit buffer #",
                               b.id, " (", buf.what, ", ", buf.bytes, " bytes)"),
                kWhere, "keep offset + bytes within the buffer");
  return static_cast<char*>(buf.ptr) + offset;
}

const ExpertGraph& CpuDevice::Impl::own_graph(const Graph& graph) const {
  auto it = graphs.find(graph.key());
  TIERMOE_CHECK(it != graphs.end() && it->second.get() == &graph,
                "launch: graph " + graph.key().str() + " was not compiled by this device", kWhere,
                "launch graphs that this device's compile() returned");
  return *it->second;
}

// Checks every argument of a launch against the graph's slots and returns
// the tensors viewing device memory; Error naming the slot and the key.
ExpertLaunch CpuDevice::Impl::bind(const ExpertGraph& g, const GraphArgs& args) const {
  const std::string& key = g.name();
  auto is_slot = [&](std::string_view name) {
    for (const GraphSlot& s : g.slots()) {
      if (s.name == name) return true;
    }
    return false;
  };
  auto slot_list = [&] {
    std::string s;
    for (const GraphSlot& slot : g.slots()) s += (s.empty() ? "" : ", ") + std::string(slot.name);
    return s;
  };
  for (size_t i = 0; i < args.tensors.size(); ++i) {
    const std::string& name = args.tensors[i].first;
    TIERMOE_CHECK(is_slot(name), detail::str_of("launch of ", key, ": no slot named '", name, "'"),
                  kWhere, "this key's slots are " + slot_list());
    for (size_t j = 0; j < i; ++j) {
      TIERMOE_CHECK(args.tensors[j].first != name,
                    detail::str_of("launch of ", key, ": slot '", name, "' is given twice"), kWhere,
                    "set each slot once");
    }
  }
  ExpertLaunch t;
  for (const GraphSlot& s : g.slots()) {
    const DeviceTensor* d = args.find(s.name);
    const std::string want = detail::str_of(dtype_name(s.dtype), shape_str(s.shape));
    TIERMOE_CHECK(d,
                  detail::str_of("launch of ", key, ": missing slot '", s.name, "' (", want, ")"),
                  kWhere, "this key's slots are " + slot_list());
    TIERMOE_CHECK(d->dtype == s.dtype && d->shape == s.shape,
                  detail::str_of("launch of ", key, ": slot '", s.name, "' is ",
                                 dtype_name(d->dtype), shape_str(d->shape), ", want ", want),
                  kWhere, "a graph computes exactly G rows of its key's D, F and dtype");
    TIERMOE_CHECK(d->offset % dtype_size(s.dtype) == 0,
                  detail::str_of("launch of ", key, ": slot '", s.name, "' starts at byte ",
                                 d->offset, ", not a multiple of its element size"),
                  kWhere, "place tensors at element-aligned offsets");
    char* p = window(d->buffer, d->offset, d->nbytes(),
                     "launch of " + key + ", slot " + std::string(s.name));
    t.*s.tensor = Tensor::from_external(p, s.shape, s.dtype, nullptr);
  }
  for (const auto& [name, value] : args.ints) {
    TIERMOE_CHECK(g.takes_int(name),
                  detail::str_of("launch of ", key, ": no integer argument named '", name, "'"),
                  kWhere, "only expert_bwd_dx_dw takes one: sum_started");
    TIERMOE_CHECK(value == 0 || value == 1,
                  detail::str_of("launch of ", key, ": sum_started is ", value, ", want 0 or 1"),
                  kWhere, "0 starts the weight-gradient sums, 1 continues them");
    t.sum_started = value == 1;
  }
  return t;
}

CpuDevice::CpuDevice(CpuDeviceConfig cfg) : impl_(std::make_unique<Impl>()) {
  TIERMOE_CHECK(cfg.threads >= 1, detail::str_of("CpuDevice needs threads >= 1, got ", cfg.threads),
                kWhere, "threads is the OpenMP thread count of the device's kernels");
  TIERMOE_CHECK(cfg.tracker, "CpuDevice needs a memory tracker", kWhere,
                "leave it at MemoryTracker::process() or pass a test's own");
  impl_->cfg = cfg;
  std::promise<int> started;
  impl_->worker = std::thread([this, &started] { impl_->worker_main(started); });
  impl_->kernel_threads = started.get_future().get();
}

CpuDevice::~CpuDevice() {
  Impl& d = *impl_;
  {
    std::lock_guard lk(d.mu);
    d.stop = true;
    d.queue.clear();
  }
  d.work_cv.notify_all();
  d.worker.join();
  for (auto& [id, b] : d.buffers) {
    std::free(b.ptr);
    d.cfg.tracker->on_free(MemTag::device, b.bytes);
  }
}

const CpuDeviceConfig& CpuDevice::config() const { return impl_->cfg; }

size_t CpuDevice::capacity() const { return impl_->cfg.memory_bytes; }

size_t CpuDevice::used() const {
  std::lock_guard lk(impl_->mu);
  return impl_->used;
}

DeviceBuffer CpuDevice::alloc(size_t bytes, BufferUsage usage, std::string_view what) {
  Impl& d = *impl_;
  TIERMOE_CHECK(bytes > 0, detail::str_of("alloc of 0 bytes for ", what), kWhere,
                "a device buffer needs at least one byte; skip the allocation instead");
  std::lock_guard lk(d.mu);
  const bool injected = d.ledger.alloc_fault_fires();
  const size_t capacity = d.cfg.memory_bytes;
  if (injected || bytes > capacity - d.used) {
    throw DeviceOutOfMemory(
        detail::str_of(injected ? "injected fault (DeviceFaults::fail_alloc): " : "",
                       "device cpu is out of memory: ", what, " (", buffer_usage_name(usage),
                       ") asks for ", bytes, " bytes, ", d.used, " of the ", capacity,
                       "-byte budget are in use"),
        kWhere, "raise --device-memory or keep fewer experts resident");
  }
  const size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = padded >= bytes ? std::aligned_alloc(kAlign, padded) : nullptr;
  if (!p) {
    throw DeviceOutOfMemory(
        detail::str_of("device cpu: the host could not provide ", bytes, " bytes for ", what),
        kWhere, "lower --device-memory: a CpuDevice's memory is host memory");
  }
  const uint64_t id = d.next_id++;
  d.buffers.emplace(id, Impl::Buffer{p, bytes, usage, std::string(what)});
  d.used += bytes;
  d.cfg.tracker->on_alloc(MemTag::device, bytes);
  return DeviceBuffer{id, bytes, usage};
}

void CpuDevice::free(DeviceBuffer& buf) {
  if (!buf.valid()) return;
  Impl& d = *impl_;
  std::unique_lock lk(d.mu);
  TIERMOE_CHECK(d.buffers.count(buf.id),
                detail::str_of("free: buffer #", buf.id, " is not a live buffer of this device"),
                kWhere, "free each buffer once, on the device that allocated it");
  d.drain(lk);
  auto it = d.buffers.find(buf.id);
  if (it == d.buffers.end()) return;  // another host thread freed it meanwhile
  std::free(it->second.ptr);
  d.used -= it->second.bytes;
  d.cfg.tracker->on_free(MemTag::device, it->second.bytes);
  d.buffers.erase(it);
  buf = DeviceBuffer{};
}

void CpuDevice::upload(const DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) {
  Impl& d = *impl_;
  TIERMOE_CHECK(src || bytes == 0, "upload: null host pointer", kWhere, "pass the source bytes");
  std::lock_guard lk(d.mu);
  char* p = d.window(dst, offset, bytes, "upload");
  d.enqueue({.kind = Impl::OpKind::upload, .bytes = bytes, .body = [p, src, bytes] {
               std::memcpy(p, src, bytes);
             }});
}

void CpuDevice::download(void* dst, const DeviceBuffer& src, size_t offset, size_t bytes) {
  Impl& d = *impl_;
  TIERMOE_CHECK(dst || bytes == 0, "download: null host pointer", kWhere,
                "pass where the bytes go");
  std::lock_guard lk(d.mu);
  const char* p = d.window(src, offset, bytes, "download");
  d.enqueue({.kind = Impl::OpKind::download, .bytes = bytes, .body = [dst, p, bytes] {
               std::memcpy(dst, p, bytes);
             }});
}

void CpuDevice::zero(const DeviceBuffer& dst, size_t offset, size_t bytes) {
  Impl& d = *impl_;
  std::lock_guard lk(d.mu);
  char* p = d.window(dst, offset, bytes, "zero");
  d.enqueue({.kind = Impl::OpKind::zero, .bytes = bytes, .body = [p, bytes] {
               std::memset(p, 0, bytes);
             }});
}

const Graph& CpuDevice::compile(const GraphKey& key) {
  Impl& d = *impl_;
  validate_graph_key(key);
  std::lock_guard compiling(d.compile_mu);
  {
    std::lock_guard lk(d.mu);
    auto it = d.graphs.find(key);
    if (it != d.graphs.end()) return *it->second;
  }
  auto graph = std::make_unique<ExpertGraph>(key, d.cfg.kernels);
  // The warm-up runs on the worker: oneDNN primitives are specialised on the
  // calling thread's thread count, so they must be made where launches run.
  std::promise<void> done;
  auto warmed = done.get_future();
  {
    std::lock_guard lk(d.mu);
    d.enqueue({.kind = Impl::OpKind::launch,
               .graph = graph.get(),
               .body = [g = graph.get()] { g->warm_up(); },
               .done = &done});
  }
  try {
    warmed.get();
  } catch (const std::exception& e) {
    throw Error(detail::str_of("compiling ", key.str(), " failed: ", e.what()), kWhere,
                "the graph's warm-up run on zeros failed; see the cause above");
  }
  std::lock_guard lk(d.mu);
  ++d.compiles;
  return *d.graphs.emplace(key, std::move(graph)).first->second;
}

void CpuDevice::launch(const Graph& graph, GraphArgs args) {
  Impl& d = *impl_;
  std::lock_guard lk(d.mu);
  const ExpertGraph& g = d.own_graph(graph);
  ExpertLaunch t = d.bind(g, args);
  d.enqueue({.kind = Impl::OpKind::launch,
             .graph = &g,
             .body = [&g, t = std::move(t)] { g.run(t); },
             .injected = d.ledger.launch_fault_fires()});
}

void CpuDevice::sync() {
  Impl& d = *impl_;
  std::unique_lock lk(d.mu);
  d.drain(lk);
  if (!d.failed) return;
  std::string what = d.failure;
  if (d.skipped > 0) what += detail::str_of(" (", d.skipped, " later ops were skipped)");
  d.failed = false;
  d.failure.clear();
  d.skipped = 0;
  throw DeviceError(what, "CpuDevice stream",
                    "the failure is cleared: new work runs again; redo the skipped work");
}

DeviceCounters CpuDevice::counters() const {
  std::lock_guard lk(impl_->mu);
  return impl_->ledger.counters();
}

void CpuDevice::reset_counters() {
  std::lock_guard lk(impl_->mu);
  impl_->ledger.reset_counters();
}

void CpuDevice::inject(const DeviceFaults& faults) {
  std::lock_guard lk(impl_->mu);
  impl_->ledger.inject(faults);
}

int64_t CpuDevice::compiles() const {
  std::lock_guard lk(impl_->mu);
  return impl_->compiles;
}

int CpuDevice::kernel_threads() const { return impl_->kernel_threads; }

}  // namespace tiermoe
