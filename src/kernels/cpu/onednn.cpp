#include "onednn.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <unordered_map>

#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/kernels/cpu_features.h"

namespace tiermoe::cpu::onednn {
namespace {

using dnnl::memory;

// Everything a matmul primitive is specialised on. Creating one costs
// 0.2-3 ms (JIT code generation), a cache hit microseconds. oneDNN 2.6 only
// picks its brgemm kernels (AMX, AVX-512) for fixed shapes: a runtime M
// (DNNL_RUNTIME_DIM_VAL) falls back to gemm:jit, which never uses AMX and is
// up to 2x slower for f32 at 32-128 rows, so shapes are cached exactly. The
// thread count is part of the key because brgemm plans its work split for
// the thread count at creation.
struct Key {
  GemmShape shape;
  int threads = 1;

  bool operator==(const Key& o) const {
    const GemmShape &a = shape, &b = o.shape;
    return a.M == b.M && a.N == b.N && a.K == b.K && a.a_transposed == b.a_transposed &&
           a.b_transposed == b.b_transposed && a.in == b.in && a.out == b.out &&
           a.accumulate == b.accumulate && threads == o.threads;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    const GemmShape& s = k.shape;
    size_t h = std::hash<int64_t>{}(s.M);
    auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(uint64_t(s.N));
    mix(uint64_t(s.K));
    mix(uint64_t(s.a_transposed) | uint64_t(s.b_transposed) << 1 | uint64_t(s.accumulate) << 2 |
        uint64_t(s.in) << 3 | uint64_t(s.out) << 5 | uint64_t(k.threads) << 8);
    return h;
  }
};

struct Entry {
  dnnl::matmul primitive;
  memory::desc a, b, c, scratchpad;
};

// Primitives are shared by every thread that asks for the same shape, so
// their scratch memory cannot live inside them: with oneDNN's default
// (library-owned) scratchpad, two threads running one primitive at once
// write into the same buffer and get wrong results (the MoE layer runs
// experts on several threads at once). Each thread brings its own instead.
void* thread_scratchpad(size_t bytes) {
  struct Buffer {
    void* ptr = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(ptr); }
  };
  thread_local Buffer buf;
  if (bytes > buf.size) {
    std::free(buf.ptr);
    size_t padded = (bytes + 4095) / 4096 * 4096;
    buf.ptr = std::aligned_alloc(4096, padded);
    if (!buf.ptr) throw std::bad_alloc();
    buf.size = padded;
  }
  return buf.ptr;
}

// Training sees one row count per expert per step, and these recur, so the
// cache stays small in practice; the cap only guards against a pathological
// stream of distinct shapes.
constexpr size_t kMaxCached = 8192;

class PrimitiveCache {
 public:
  // Returns a copy (oneDNN objects are reference-counted handles), so a
  // later clear() cannot pull a primitive away from a running caller.
  Entry get(const GemmShape& s) {
    Key key{s, num_threads()};
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
    if (map_.size() >= kMaxCached) map_.clear();
    return map_.emplace(key, create(s)).first->second;
  }

  size_t size() {
    std::lock_guard lock(mutex_);
    return map_.size();
  }

 private:
  static Entry create(const GemmShape& s) {
    memory::data_type in = to_dnnl(s.in), out = to_dnnl(s.out);
    Entry e;
    e.a =
        memory::desc({s.M, s.K}, in, s.a_transposed ? memory::dims{1, s.M} : memory::dims{s.K, 1});
    e.b =
        memory::desc({s.K, s.N}, in, s.b_transposed ? memory::dims{1, s.K} : memory::dims{s.N, 1});
    e.c = memory::desc({s.M, s.N}, out, {s.N, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (s.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.c), attr, engine());
    e.primitive = dnnl::matmul(pd);
    e.scratchpad = pd.scratchpad_desc();
    return e;
  }

  std::mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> map_;
};

PrimitiveCache& cache() {
  static PrimitiveCache c;
  return c;
}

std::string shape_text(const GemmShape& s) {
  return detail::str_of("C[", s.M, ", ", s.N, "] ", dtype_name(s.out),
                        (s.accumulate ? " += " : " = "), "A[", s.M, ", ", s.K, "]",
                        (s.a_transposed ? "^T" : ""), " . B[", s.K, ", ", s.N, "]",
                        (s.b_transposed ? "^T" : ""), " ", dtype_name(s.in));
}

}  // namespace

dnnl::engine& engine() {
  static dnnl::engine e = [] {
    request_amx_permission();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return e;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

memory::data_type to_dnnl(DType dt) {
  switch (dt) {
    case DType::f32:
      return memory::data_type::f32;
    case DType::bf16:
      return memory::data_type::bf16;
    case DType::f64:
      break;
  }
  throw Error("oneDNN has no f64 matmul", "tiermoe::cpu::onednn",
              "f64 products run on TierMoE's own f64 GEMM (kernels/cpu/gemm_f64)");
}

void gemm(const GemmShape& s, const void* a, const void* b, void* c) {
  if (s.M == 0 || s.N == 0) return;
  if (s.K == 0) {
    if (!s.accumulate) std::memset(c, 0, size_t(s.M * s.N) * dtype_size(s.out));
    return;
  }
  try {
    Entry e = cache().get(s);
    memory am(e.a, engine(), const_cast<void*>(a));
    memory bm(e.b, engine(), const_cast<void*>(b));
    memory cm(e.c, engine(), c);
    memory sm(e.scratchpad, engine(), thread_scratchpad(e.scratchpad.get_size()));
    e.primitive.execute(stream(), {{DNNL_ARG_SRC, am},
                                   {DNNL_ARG_WEIGHTS, bm},
                                   {DNNL_ARG_DST, cm},
                                   {DNNL_ARG_SCRATCHPAD, sm}});
    stream().wait();
  } catch (const dnnl::error& err) {
    throw Error(detail::str_of("oneDNN matmul failed (", err.what(), ") for ", shape_text(s)),
                "tiermoe::cpu::onednn::gemm",
                "check that oneDNN (libdnnl) supports this dtype on this CPU");
  }
}

size_t cached_primitives() { return cache().size(); }

}  // namespace tiermoe::cpu::onednn
