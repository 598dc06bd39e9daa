#include "pack.h"

#include <algorithm>
#include <cstring>

#include "tiermoe/core/error.h"

namespace tiermoe::cpu::gemm {
namespace {

// A packed element from a source element: f32 formats take floats (bf16
// widened exactly), bf16 formats take the bits as they are.
template <class D, class S>
D convert(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else {
    static_assert(std::is_same_v<D, float> && std::is_same_v<S, uint16_t>);
    return std::bit_cast<float>(uint32_t(v) << 16);
  }
}

// dst[idx(x, k)] = src(x0 + x, k0 + k) for x < n valid lines (rows of A,
// columns of B), k < kv valid, with (line, k) at src[line * ls + k * ks].
// k runs outside and the lines inside, so the writes of one k are
// contiguous; the reads are n streams along k (a weight's rows in the
// forward) or one contiguous run (its columns in dx).
template <class D, class S, class Idx>
void pack_lines(const S* src, int64_t ls, int64_t ks, int64_t x0, int64_t n, int64_t k0, int64_t kv,
                D* dst, Idx idx) {
  const S* base = src + x0 * ls + k0 * ks;
  for (int64_t k = 0; k < kv; ++k) {
    const S* at_k = base + k * ks;
    for (int64_t x = 0; x < n; ++x) dst[idx(x, k)] = convert<D>(at_k[x * ls]);
  }
}

// Calls fn(typed source pointer) for the microkernel's input dtype.
template <class Fn>
void with_source(const Microkernel& uk, const void* p, Fn&& fn) {
  if (uk.in == DType::f32) {
    fn(static_cast<const float*>(p));
  } else {
    TIERMOE_ASSERT(uk.in == DType::bf16);
    fn(static_cast<const uint16_t*>(p));
  }
}

}  // namespace

void pack_a(const Microkernel& uk, const Mat& a, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
            int64_t K, void* dst) {
  const int64_t mr = uk.mr, kv = std::clamp<int64_t>(K - k0, 0, kc);
  if (rows < mr || kv < kc) std::memset(dst, 0, size_t(a_panel_bytes(uk, kc)));
  with_source(uk, a.p, [&]<class S>(const S* src) {
    switch (uk.a) {
      case APack::f32_kmajor:
        pack_lines(src, a.rs, a.cs, i0, rows, k0, kv, static_cast<float*>(dst),
                   [mr](int64_t r, int64_t k) { return k * mr + r; });
        return;
      case APack::bf16_pairs:
        if constexpr (std::is_same_v<S, uint16_t>) {
          pack_lines(src, a.rs, a.cs, i0, rows, k0, kv, static_cast<uint16_t*>(dst),
                     [mr](int64_t r, int64_t k) { return ((k >> 1) * mr + r) * 2 + (k & 1); });
          return;
        }
        break;
      case APack::bf16_rows:
        if constexpr (std::is_same_v<S, uint16_t>) {
          pack_lines(src, a.rs, a.cs, i0, rows, k0, kv, static_cast<uint16_t*>(dst),
                     [kc](int64_t r, int64_t k) { return r * kc + k; });
          return;
        }
        break;
    }
    TIERMOE_ASSERT(false, "A layout needs bf16 inputs");
  });
}

void pack_b(const Microkernel& uk, const Mat& b, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
            int64_t K, void* dst) {
  const int64_t nr = uk.nr, half = nr / 2, kv = std::clamp<int64_t>(K - k0, 0, kc);
  if (cols < nr || kv < kc) std::memset(dst, 0, size_t(b_panel_bytes(uk, kc)));
  // B(k, j) = p[k * rs + j * cs]: a column j is a "line" with stride cs.
  with_source(uk, b.p, [&]<class S>(const S* src) {
    switch (uk.b) {
      case BPack::f32:
        pack_lines(src, b.cs, b.rs, j0, cols, k0, kv, static_cast<float*>(dst),
                   [nr](int64_t j, int64_t k) { return k * nr + j; });
        return;
      case BPack::bf16_split:
        if constexpr (std::is_same_v<S, uint16_t>) {
          pack_lines(src, b.cs, b.rs, j0, cols, k0, kv, static_cast<uint16_t*>(dst),
                     [half](int64_t j, int64_t k) {
                       return j < half ? (k * half + j) * 2 : (k * half + j - half) * 2 + 1;
                     });
          return;
        }
        break;
      case BPack::bf16_pairs:
        if constexpr (std::is_same_v<S, uint16_t>) {
          pack_lines(src, b.cs, b.rs, j0, cols, k0, kv, static_cast<uint16_t*>(dst),
                     [nr](int64_t j, int64_t k) { return ((k >> 1) * nr + j) * 2 + (k & 1); });
          return;
        }
        break;
    }
    TIERMOE_ASSERT(false, "B layout needs bf16 inputs");
  });
}

}  // namespace tiermoe::cpu::gemm
