#include "pack.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "../bf16_avx2.h"
#include "tiermoe/core/error.h"

namespace tiermoe::cpu::gemm {
namespace {

// A packed element from a source element: f32 layouts take floats (bf16
// widened exactly), bf16 layouts take bf16 bits (f32 rounded to nearest even).
template <class D, class S>
D convert(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (std::is_same_v<D, float>) {
    static_assert(std::is_same_v<S, uint16_t>);
    return std::bit_cast<float>(uint32_t(v) << 16);
  } else {
    static_assert(std::is_same_v<D, uint16_t> && std::is_same_v<S, float>);
    return float_to_bf16(v).bits;
  }
}

// Where a packed layout puts (line x, k) (a line is a row of A or a column of
// B): every layout of microkernel.h is a sum of a line part and a k part,
//   line part  lines [0, split) at x * stride, lines [split, n) at
//              (x - split) * stride + 1 (bf16_split's high halves; split = n
//              elsewhere)
//   k part     k * k_mul, or with pairs (k >> 1) * k_mul + (k & 1)
// so the packing loops below are affine in both and carry no per-element
// branch.
// bf16_tiles is the one layout outside that form: k's block of 32 at
// (k / 32) * k_tile, then k % 32 (pack_tiles below).
struct Layout {
  int64_t stride = 1, split = 0, k_mul = 0;
  bool pairs = false;
  int64_t k_tile = 0;
};

// The 32-bit units the transposes below move: a source element as a float
// (f32, or bf16 widened exactly), or a pair of bf16 (k = 2p, 2p+1 of one
// line) as it stands, the dword bf16_pairs layouts hold.
template <class S>
struct Widened {
  static constexpr int64_t kPer = 1;  // source elements per unit
  static __m256 load8(const float* s) { return _mm256_loadu_ps(s); }
  static __m256 load8(const uint16_t* s) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void one(const S* s, void* d) {
    const float v = convert<float>(*s);
    std::memcpy(d, &v, 4);
  }
};
template <class S>
struct Bf16Pairs {
  static constexpr int64_t kPer = 2;
  static __m256 load8(const uint16_t* s) {
    return _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  }
  // 16 floats rounded, narrowed in order (packus works per 128-bit lane).
  static __m256 load8(const float* s) {
    const __m256i lo = round8_bf16(_mm256_loadu_ps(s)), hi = round8_bf16(_mm256_loadu_ps(s + 8));
    return _mm256_castsi256_ps(_mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8));
  }
  static void one(const S* s, void* d) {
    const uint16_t h[2] = {convert<uint16_t>(s[0]), convert<uint16_t>(s[1])};
    std::memcpy(d, h, 4);
  }
};

// Units [0, units) of lines [0, n) of `base` (unit u of line x at base +
// x * ls + u * kPer) into dst's 32-bit slots x + u * k_mul: a transpose, which
// the plain loop does one strided store at a time (a fifth of the flash
// attention's time went there). Blocks of 8 lines x 8 units are transposed
// in registers, then blocks of 4 lines; the tails one unit at a time. The
// same bits land in the same places as the plain loop puts them.
template <class U, class S>
void transpose_units(const S* base, int64_t ls, int64_t n, int64_t units, void* dst_v,
                     int64_t k_mul) {
  auto* dst = static_cast<float*>(dst_v);  // written through intrinsics and memcpy only
  const int64_t u8 = units / 8 * 8;
  auto line = [&](int64_t x, int64_t u) { return base + x * ls + u * U::kPer; };
  int64_t x = 0;
  for (; x + 8 <= n; x += 8) {
    for (int64_t u = 0; u < u8; u += 8) {
      __m256 r[8], t[8], v[8];
      for (int i = 0; i < 8; ++i) r[i] = U::load8(line(x + i, u));
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        v[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        v[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        v[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        v[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
      }
      // v[c] (c < 4) holds unit u + c (low lane) and u + c + 4 (high) of
      // lines x..x+3; v[c + 4] the same of lines x+4..x+7.
      for (int c = 0; c < 4; ++c) {
        _mm256_storeu_ps(dst + (u + c) * k_mul + x, _mm256_permute2f128_ps(v[c], v[c + 4], 0x20));
        _mm256_storeu_ps(dst + (u + c + 4) * k_mul + x,
                         _mm256_permute2f128_ps(v[c], v[c + 4], 0x31));
      }
    }
  }
  for (; x + 4 <= n; x += 4) {
    for (int64_t u = 0; u < u8; u += 8) {
      __m256 r[4], t[4];
      for (int i = 0; i < 4; ++i) r[i] = U::load8(line(x + i, u));
      t[0] = _mm256_unpacklo_ps(r[0], r[1]), t[1] = _mm256_unpackhi_ps(r[0], r[1]);
      t[2] = _mm256_unpacklo_ps(r[2], r[3]), t[3] = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 v[4] = {_mm256_shuffle_ps(t[0], t[2], 0x44), _mm256_shuffle_ps(t[0], t[2], 0xee),
                           _mm256_shuffle_ps(t[1], t[3], 0x44), _mm256_shuffle_ps(t[1], t[3], 0xee)};
      for (int c = 0; c < 4; ++c) {
        _mm_storeu_ps(dst + (u + c) * k_mul + x, _mm256_castps256_ps128(v[c]));
        _mm_storeu_ps(dst + (u + c + 4) * k_mul + x, _mm256_extractf128_ps(v[c], 1));
      }
    }
  }
  // The lines left over, at every unit; then the unit tail of the blocked lines.
  for (int64_t y = x; y < n; ++y) {
    for (int64_t u = 0; u < units; ++u) U::one(line(y, u), dst + u * k_mul + y);
  }
  for (int64_t y = 0; y < x; ++y) {
    for (int64_t u = u8; u < units; ++u) U::one(line(y, u), dst + u * k_mul + y);
  }
}

// bf16 pairs from lines contiguous at each k (V and a weight's columns in
// dx; the attention's f32 P^T and dS^T, rounded): rows k and k + 1
// interleaved, dst[(k / 2) * k_mul + 2 x + (k & 1)]; past an odd kv the
// pair's second half is zero, as the layout pads K.
template <class S>
void interleave_pairs(const S* base, int64_t ks, int64_t n, int64_t kv, uint16_t* dst,
                      int64_t k_mul) {
  for (int64_t k = 0; k < kv; k += 2) {
    const S* r0 = base + k * ks;
    const S* r1 = k + 1 < kv ? r0 + ks : nullptr;
    uint16_t* d = dst + (k >> 1) * k_mul;
    int64_t x = 0;
    for (; x + 8 <= n; x += 8) {
      if constexpr (std::is_same_v<S, float>) {
        const __m256i lo = round8_bf16(_mm256_loadu_ps(r0 + x));
        const __m256i hi = r1 ? round8_bf16(_mm256_loadu_ps(r1 + x)) : _mm256_setzero_si256();
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 2 * x),
                            _mm256_or_si256(lo, _mm256_slli_epi32(hi, 16)));
      } else {
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + x));
        const __m128i hi =
            r1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + x)) : _mm_setzero_si128();
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * x), _mm_unpacklo_epi16(lo, hi));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * x + 8), _mm_unpackhi_epi16(lo, hi));
      }
    }
    for (; x < n; ++x) {
      d[2 * x] = convert<uint16_t>(r0[x]);
      d[2 * x + 1] = r1 ? convert<uint16_t>(r1[x]) : uint16_t(0);
    }
  }
}

// bf16_tiles: each line's runs of 32 k, one to a row of a tile. A row-major
// bf16 A (the activations) is a copy per run; a transposed one is read along
// its lines, one k at a time.
template <class D, class S>
void pack_tiles(const S* base, int64_t ls, int64_t ks, int64_t n, int64_t kv, D* dst,
                const Layout& l) {
  if (ks != 1) {  // lines contiguous at each k (dW's transposed A): read along them
    for (int64_t k = 0; k < kv; ++k) {
      const S* in = base + k * ks;
      D* out = dst + k / 32 * l.k_tile + k % 32;
      for (int64_t x = 0; x < n; ++x) out[x * l.stride] = convert<D>(in[x * ls]);
    }
    return;
  }
  for (int64_t x = 0; x < n; ++x) {
    for (int64_t kb = 0; kb < kv; kb += 32) {
      const S* in = base + x * ls + kb;
      D* out = dst + kb / 32 * l.k_tile + x * l.stride;
      const int64_t m = std::min<int64_t>(32, kv - kb);
      for (int64_t k = 0; k < m; ++k) out[k] = convert<D>(in[k]);
    }
  }
}

// dst[place(x, k)] = src(x0 + x, k0 + k) for x < n valid lines, k < kv
// valid, with (line, k) at src[line * ls + k * ks]. The loop order follows
// the source: when k is contiguous within a line (a weight's rows in the
// forward) each line is read as one run, otherwise (its columns in dx, rows
// of activations' A operand) each k's lines are. Either way the writes land
// in one panel, which stays in L1.
template <bool Pairs, class D, class S>
void pack_lines(const S* src, int64_t ls, int64_t ks, int64_t x0, int64_t n, int64_t k0, int64_t kv,
                D* dst, const Layout& l) {
  const S* base = src + x0 * ls + k0 * ks;
  if constexpr (!Pairs && std::is_same_v<D, uint16_t>) {
    if (l.k_tile) return pack_tiles(base, ls, ks, n, kv, dst, l);
  }
  auto k_part = [&](int64_t k) { return Pairs ? (k >> 1) * l.k_mul + (k & 1) : k * l.k_mul; };
  const int64_t lo = std::min(n, l.split);
  // The two line ranges: [first, last) placed from `offset` on.
  const struct { int64_t first, last, offset; } ranges[2] = {{0, lo, 0}, {lo, n, 1}};
  for (const auto& r : ranges) {
    if (r.first >= r.last) continue;
    const int64_t n_r = r.last - r.first;
    if constexpr (!Pairs && std::is_same_v<D, float>) {
      if (ks == 1 && l.stride == 1) {  // f32_kmajor A, f32 B: a transpose
        transpose_units<Widened<S>>(base + r.first * ls, ls, n_r, kv, dst + r.offset, l.k_mul);
        continue;
      }
    }
    if constexpr (Pairs && std::is_same_v<D, uint16_t>) {
      if (ks == 1 && l.stride == 2) {  // a transpose of k pairs, then an odd last k
        const S* lines = base + r.first * ls;
        transpose_units<Bf16Pairs<S>>(lines, ls, n_r, kv / 2, dst + r.offset, l.k_mul / 2);
        if (kv % 2) {
          for (int64_t x = 0; x < n_r; ++x) {
            dst[k_part(kv - 1) + x * 2] = convert<D>(lines[x * ls + kv - 1]);
          }
        }
        continue;
      }
      if (ls == 1 && l.stride == 2) {
        interleave_pairs(base + r.first, ks, n_r, kv, dst + r.offset, l.k_mul);
        continue;
      }
    }
    if (ks == 1) {
      for (int64_t x = r.first; x < r.last; ++x) {
        const S* line = base + x * ls;
        D* out = dst + (x - r.first) * l.stride + r.offset;
        for (int64_t k = 0; k < kv; ++k) out[k_part(k)] = convert<D>(line[k]);
      }
    } else {
      for (int64_t k = 0; k < kv; ++k) {
        const S* at_k = base + k * ks + r.first * ls;
        D* out = dst + k_part(k) + r.offset;
        if (ls == 1 && l.stride == 1) {  // a run of both: let the compiler vectorize it
          for (int64_t x = 0; x < n_r; ++x) out[x] = convert<D>(at_k[x]);
        } else {
          for (int64_t x = 0; x < n_r; ++x) out[x * l.stride] = convert<D>(at_k[x * ls]);
        }
      }
    }
  }
}

template <class D, class S>
void pack_as(const S* src, int64_t ls, int64_t ks, int64_t x0, int64_t n, int64_t k0, int64_t kv,
             void* dst, const Layout& l) {
  if (l.pairs) {
    pack_lines<true>(src, ls, ks, x0, n, k0, kv, static_cast<D*>(dst), l);
  } else {
    pack_lines<false>(src, ls, ks, x0, n, k0, kv, static_cast<D*>(dst), l);
  }
}

// Packs a source of dtype src into an f32 (f32_dst) or a bf16 layout.
void pack_typed(DType src, bool f32_dst, const void* p, int64_t ls, int64_t ks, int64_t x0,
                int64_t n, int64_t k0, int64_t kv, void* dst, const Layout& l) {
  TIERMOE_ASSERT(src == DType::f32 || src == DType::bf16, "packing reads f32 or bf16");
  if (src == DType::f32) {
    const auto* s = static_cast<const float*>(p);
    f32_dst ? pack_as<float>(s, ls, ks, x0, n, k0, kv, dst, l)
            : pack_as<uint16_t>(s, ls, ks, x0, n, k0, kv, dst, l);
  } else {
    const auto* s = static_cast<const uint16_t*>(p);
    f32_dst ? pack_as<float>(s, ls, ks, x0, n, k0, kv, dst, l)
            : pack_as<uint16_t>(s, ls, ks, x0, n, k0, kv, dst, l);
  }
}

}  // namespace

void pack_a(const Microkernel& uk, const Mat& a, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
            int64_t K, void* dst) {
  const int64_t mr = uk.mr, kv = std::clamp<int64_t>(K - k0, 0, kc);
  if (rows < mr || kv < kc) std::memset(dst, 0, size_t(a_panel_bytes(uk, kc)));
  Layout l{.split = rows};
  switch (uk.a) {
    case APack::f32_kmajor:  // [kc][mr]
      l.stride = 1, l.k_mul = mr;
      break;
    case APack::bf16_pairs:  // [kc/2][mr][2]
      l.stride = 2, l.k_mul = 2 * mr, l.pairs = true;
      break;
    case APack::bf16_tiles:  // [kc/32][mr][32]
      l.stride = 32, l.k_mul = 1, l.k_tile = 32 * mr;
      break;
  }
  pack_typed(a.dt, uk.a == APack::f32_kmajor, a.p, a.rs, a.cs, i0, rows, k0, kv, dst, l);
}

void pack_b(const Microkernel& uk, const Mat& b, int64_t j0, int64_t cols, int64_t k0, int64_t kc,
            int64_t K, void* dst) {
  const int64_t nr = uk.nr, kv = std::clamp<int64_t>(K - k0, 0, kc);
  if (cols < nr || kv < kc) std::memset(dst, 0, size_t(b_panel_bytes(uk, kc)));
  Layout l{.split = cols};
  switch (uk.b) {
    case BPack::f32:  // [kc][nr]
      l.stride = 1, l.k_mul = nr;
      break;
    case BPack::bf16_split:  // bf16 [kc][nr/2][2]: column d, then d + nr/2
      l.stride = 2, l.split = std::min(cols, nr / 2), l.k_mul = nr;
      break;
    case BPack::bf16_pairs:  // [kc/2][nr][2]
      l.stride = 2, l.k_mul = 2 * nr, l.pairs = true;
      break;
  }
  // B(k, j) = p[k * rs + j * cs]: a column j is a line with stride cs.
  pack_typed(b.dt, uk.b == BPack::f32, b.p, b.cs, b.rs, j0, cols, k0, kv, dst, l);
}

}  // namespace tiermoe::cpu::gemm
