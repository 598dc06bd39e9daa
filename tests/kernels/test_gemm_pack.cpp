// The packed operand layouts (src/kernels/cpu/gemm/pack.h) element by
// element against the formulas of microkernel.h, for every ISA's microkernel
// (packing is plain C++, so each ISA's layouts are checked on any machine):
// partial panels, a K tail, both orientations of the source, f32 and bf16
// layouts, each from an f32 and a bf16 source (converted while packing).
// The GEMM tests check the same layouts only through products.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "../../src/kernels/cpu/gemm/pack.h"
#include "tiermoe/core/dtype.h"

namespace tiermoe {
namespace {

namespace gemm = cpu::gemm;

// A source matrix of `lines` x `depth` with distinct, nonzero entries (the
// f32 copy holds the bf16 values widened), stored
// with k contiguous (k_major = false: element (x, k) at x * depth + k) or
// lines contiguous (x + k * lines).
struct Source {
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  int64_t ls = 0, ks = 0;
};

Source source(int64_t lines, int64_t depth, bool k_contiguous) {
  Source s;
  s.ls = k_contiguous ? depth : 1;
  s.ks = k_contiguous ? 1 : lines;
  s.bf16.resize(size_t(lines * depth));
  s.f32.resize(s.bf16.size());
  for (int64_t x = 0; x < lines; ++x) {
    for (int64_t k = 0; k < depth; ++k) {
      // Distinct bf16 bits per (x, k) (k < 256), so a misplaced element shows.
      const auto bits = uint16_t(0x3000 + x * 256 + k);
      const size_t at = size_t(x * s.ls + k * s.ks);
      s.bf16[at] = bits;
      s.f32[at] = std::bit_cast<float>(uint32_t(bits) << 16);
    }
  }
  return s;
}

// The packed value of (x, k) as the layout stores it: its f32 value, widened
// from bf16 bits for bf16 layouts.
std::vector<float> unpack(const std::vector<char>& bytes, bool f32_layout) {
  std::vector<float> out;
  if (f32_layout) {
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    std::vector<uint16_t> h(bytes.size() / 2);
    std::memcpy(h.data(), bytes.data(), bytes.size());
    for (uint16_t v : h) out.push_back(std::bit_cast<float>(uint32_t(v) << 16));
  }
  return out;
}

// The element index microkernel.h gives (line x, k) in a panel of `width`
// lines (mr or nr) over kc.
int64_t a_index(gemm::APack a, int64_t mr, int64_t r, int64_t k) {
  switch (a) {
    case gemm::APack::f32_kmajor:
      return k * mr + r;
    case gemm::APack::bf16_pairs:
      return ((k >> 1) * mr + r) * 2 + (k & 1);
    case gemm::APack::bf16_tiles:
      return (k / 32) * (mr * 32) + r * 32 + k % 32;
  }
  return -1;
}
int64_t b_index(gemm::BPack b, int64_t nr, int64_t j, int64_t k) {
  const int64_t half = nr / 2;
  switch (b) {
    case gemm::BPack::f32:
      return k * nr + j;
    case gemm::BPack::bf16_split:
      return j < half ? (k * half + j) * 2 : (k * half + j - half) * 2 + 1;
    case gemm::BPack::bf16_pairs:
      return ((k >> 1) * nr + j) * 2 + (k & 1);
  }
  return -1;
}

struct Case {
  CpuIsa isa;
  DType in;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(cpu_isa_name(info.param.isa)) + "_" + std::string(dtype_name(info.param.in));
}

class GemmPack : public ::testing::TestWithParam<Case> {};

// Each panel shape: full and partial lines, a whole kc and a K tail inside
// it, a second kc block (k0 > 0), k contiguous or not.
TEST_P(GemmPack, PanelsMatchTheDocumentedLayout) {
  const gemm::Microkernel& uk = gemm::microkernel(GetParam().isa, GetParam().in);
  const int64_t kc = 2 * uk.k_step * 8;  // a whole number of k_steps
  for (const DType src : {DType::f32, DType::bf16}) {
    for (bool k_contiguous : {true, false}) {
      for (int64_t K : {kc, 2 * kc, kc + 3 * uk.k_step - 1}) {
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
          for (const bool is_a : {true, false}) {
            const int64_t width = is_a ? uk.mr : uk.nr;
            for (int64_t valid : {width, width - 1, int64_t(1), width / 2 + 1}) {
              SCOPED_TRACE(::testing::Message()
                           << (is_a ? "A" : "B") << " K " << K << " k0 " << k0 << " valid " << valid
                           << " k contiguous " << k_contiguous);
              const int64_t lines = valid + 3, x0 = 2;  // an offset into the source's lines
              const Source s = source(lines, K, k_contiguous);
              const void* p =
                  src == DType::bf16 ? static_cast<const void*>(s.bf16.data()) : s.f32.data();
              const int64_t bytes =
                  is_a ? gemm::a_panel_bytes(uk, kc) : gemm::b_panel_bytes(uk, kc);
              std::vector<char> dst(size_t(bytes), char(0x5a));  // garbage where zeros belong
              const bool f32_layout =
                  is_a ? uk.a == gemm::APack::f32_kmajor : uk.b == gemm::BPack::f32;
              if (is_a) {
                // A(i, k) at p[i * rs + k * cs].
                gemm::pack_a(uk, gemm::Mat{p, s.ls, s.ks, src}, x0, valid, k0, kc, K, dst.data());
              } else {
                // B(k, j) at p[k * rs + j * cs]: its column j is source line j.
                gemm::pack_b(uk, gemm::Mat{p, s.ks, s.ls, src}, x0, valid, k0, kc, K, dst.data());
              }
              const std::vector<float> got = unpack(dst, f32_layout);
              std::vector<float> want(got.size(), 0.0f);
              for (int64_t x = 0; x < valid; ++x) {
                for (int64_t k = 0; k < std::min(kc, K - k0); ++k) {
                  const int64_t at = is_a ? a_index(uk.a, uk.mr, x, k) : b_index(uk.b, uk.nr, x, k);
                  want[size_t(at)] = s.f32[size_t((x0 + x) * s.ls + (k0 + k) * s.ks)];
                }
              }
              ASSERT_EQ(got, want);
            }
          }
        }
      }
    }
  }
}

// f32 into a bf16 layout rounds each value to nearest even (ties included),
// as float_to_bf16 does, NaNs quieted, infinities and subnormals as they
// round; into an f32 layout it is copied. Bits are compared, so a NaN counts.
TEST_P(GemmPack, F32SourcesRoundIntoBf16Layouts) {
  const gemm::Microkernel& uk = gemm::microkernel(GetParam().isa, GetParam().in);
  const int64_t kc = 2 * uk.k_step * 4, width = uk.nr;
  std::vector<float> src(size_t(width * kc));
  for (size_t i = 0; i < src.size(); ++i) {
    // 1 + i/128 ulps of bf16 past 1.5: below, at and above each tie.
    src[i] = std::bit_cast<float>(0x3fc00000u + uint32_t(i % 512) * 0x40u);
  }
  // Specials, some inside the packing's vector blocks and some in its tails.
  const uint32_t specials[] = {0x7f800001u, 0xffc12345u, 0x7f800000u, 0xff800000u, 0x00000001u,
                               0x0000ffffu, 0x00018000u, 0x80008000u, 0x7f7fffffu};
  for (size_t i = 0; i < std::size(specials); ++i) {
    src[(i * 37) % src.size()] = std::bit_cast<float>(specials[i]);
    src[src.size() - 1 - i] = std::bit_cast<float>(specials[i]);
  }
  // The values of column j at k in either orientation: k contiguous (src[j *
  // kc + k]) or the columns contiguous at each k (src[k * width + j]).
  for (const bool k_contiguous : {true, false}) {
    SCOPED_TRACE(k_contiguous ? "k contiguous" : "columns contiguous");
    const int64_t rs = k_contiguous ? 1 : width, cs = k_contiguous ? kc : 1;
    std::vector<char> dst(size_t(gemm::b_panel_bytes(uk, kc)));
    gemm::pack_b(uk, gemm::Mat{src.data(), rs, cs, DType::f32}, 0, width, 0, kc, kc, dst.data());
    const bool f32_layout = uk.b == gemm::BPack::f32;
    const std::vector<float> got = unpack(dst, f32_layout);
    for (int64_t j = 0; j < width; ++j) {
      for (int64_t k = 0; k < kc; ++k) {
        const float v = src[size_t(k * rs + j * cs)];
        const float want = f32_layout ? v : bf16_to_float(float_to_bf16(v));
        ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(b_index(uk.b, uk.nr, j, k))]),
                  std::bit_cast<uint32_t>(want))
            << "column " << j << " k " << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryMicrokernel, GemmPack,
    ::testing::Values(Case{CpuIsa::avx2, DType::f32}, Case{CpuIsa::avx2, DType::bf16},
                      Case{CpuIsa::avx512, DType::f32}, Case{CpuIsa::avx512, DType::bf16},
                      Case{CpuIsa::avx512bf16, DType::bf16}, Case{CpuIsa::amx, DType::bf16}),
    case_name);

}  // namespace
}  // namespace tiermoe
