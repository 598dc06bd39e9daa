// Stored low-bit matrices (kernels/quant.h): each format's decode against
// its definition (known codes, edge blocks, NaN), the row decoder against
// the oracle, the int quantizer's bounds, and the grouped products over
// quantized weights equal to the same products over the dequantized
// weights, bit for bit, on every ISA the machine runs (the others skip).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../../src/kernels/cpu/gemm/driver.h"
#include "common/testing.h"
#include "kernels/isa_test_util.h"
#include "tiermoe/kernels/grouped_matmul.h"
#include "tiermoe/kernels/quant.h"

namespace tiermoe {
namespace {

using testing::bitwise_equal;
using testing::random_tensor;

// A matrix over bytes this test owns.
struct Owned {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<uint8_t> scale_bytes;
};

QuantMatrix over(std::shared_ptr<Owned> o, QuantFormat f, int64_t rows, int64_t cols,
                 int64_t group, int64_t code_stride, int64_t scale_stride) {
  QuantMatrix q;
  q.format = f;
  q.rows = rows, q.cols = cols, q.group = group;
  q.codes = o->codes.data();
  q.code_stride = code_stride;
  q.scales = f == QuantFormat::mxfp4 ? static_cast<const void*>(o->scale_bytes.data())
                                     : static_cast<const void*>(o->scales.data());
  q.scale_stride = scale_stride;
  q.row_group = f == QuantFormat::fp8 ? 128 : 1;
  q.owner = o;
  return q;
}

// Random codes of every format (fp8's NaN codes left out), scales that keep
// the values O(1).
QuantMatrix random_quant(QuantFormat f, int64_t rows, int64_t cols, Rng& rng) {
  if (f == QuantFormat::int4 || f == QuantFormat::int8) {
    return quantize_int(random_tensor({rows, cols}, DType::f32, rng, 0.3), f,
                        f == QuantFormat::int4 ? 32 : 64);
  }
  auto o = std::make_shared<Owned>();
  const bool mx = f == QuantFormat::mxfp4;
  const int64_t stride = mx ? (cols + 1) / 2 : cols;
  o->codes.resize(size_t(rows * stride));
  for (uint8_t& b : o->codes) {
    b = uint8_t(rng.below(256));
    if (!mx && (b & 0x7f) == 0x7f) b &= 0xfe;  // not NaN
  }
  if (mx) {
    const int64_t sc = (cols + 31) / 32;
    o->scale_bytes.resize(size_t(rows * sc));
    for (uint8_t& s : o->scale_bytes) s = uint8_t(122 + rng.below(4));
    return over(o, f, rows, cols, 32, stride, sc);
  }
  const int64_t sc = (cols + 127) / 128;
  o->scales.resize(size_t((rows + 127) / 128 * sc));
  for (float& s : o->scales) s = float(rng.uniform(0.0005, 0.002));
  return over(o, f, rows, cols, 128, stride, sc);
}

TEST(Quant, Int4PacksAsCompressedTensors) {
  // compressed-tensors' pack_to_int32 packs the int4 row [1..7, -8] into
  // the word 0x0fedcba9 (the first element in the lowest nibble).
  auto o = std::make_shared<Owned>();
  const uint32_t word = 0x0fedcba9u;
  o->codes.resize(4);
  std::memcpy(o->codes.data(), &word, 4);
  o->scales = {0.5f};
  const Tensor w = dequantize(over(o, QuantFormat::int4, 1, 8, 8, 4, 1), DType::f64);
  EXPECT_EQ(w.to_vector(), (std::vector<double>{0.5, 1, 1.5, 2, 2.5, 3, 3.5, -4}));
}

TEST(Quant, Fp8E4m3Values) {
  auto o = std::make_shared<Owned>();
  o->codes = {0x38, 0x7e, 0xfe, 0x01, 0x08, 0x80, 0x7f, 0xff, 0x40, 0x3c};
  o->scales = {1.f};
  const Tensor w = dequantize(over(o, QuantFormat::fp8, 1, 10, 128, 10, 1), DType::f64);
  const std::vector<double> v = w.to_vector();
  EXPECT_EQ(v[0], 1.0);
  EXPECT_EQ(v[1], 448.0);
  EXPECT_EQ(v[2], -448.0);
  EXPECT_EQ(v[3], std::ldexp(1.0, -9));  // the smallest subnormal
  EXPECT_EQ(v[4], std::ldexp(1.0, -6));  // the smallest normal
  EXPECT_TRUE(v[5] == 0.0 && std::signbit(v[5]));
  EXPECT_TRUE(std::isnan(v[6]) && std::isnan(v[7]));
  EXPECT_EQ(v[8], 2.0);
  EXPECT_EQ(v[9], 1.5);
}

TEST(Quant, Fp8EdgeBlocksUseTheirBlocksScale) {
  // [130, 260]: scales [2, 3], the last row and column of blocks partial.
  auto o = std::make_shared<Owned>();
  o->codes.assign(130 * 260, 0x38);  // 1.0
  o->scales = {1, 2, 3, 4, 5, 6};
  const Tensor w = dequantize(over(o, QuantFormat::fp8, 130, 260, 128, 260, 3), DType::f64);
  for (int64_t r : {0, 127, 128, 129}) {
    for (int64_t c : {0, 127, 128, 255, 256, 259}) {
      EXPECT_EQ(w.get(r * 260 + c), double((r / 128) * 3 + c / 128 + 1)) << r << ", " << c;
    }
  }
}

TEST(Quant, Mxfp4NibblesAndExponents) {
  auto o = std::make_shared<Owned>();
  o->codes.assign(16, 0);
  o->codes[0] = 0x9f;  // element 0: code 15 (-6), element 1: code 9 (-0.5)
  o->codes[1] = 0x27;  // element 2: code 7 (6), element 3: code 2 (1)
  o->scale_bytes = {128};  // x2
  const Tensor w = dequantize(over(o, QuantFormat::mxfp4, 1, 32, 32, 16, 1), DType::f64);
  EXPECT_EQ(w.get(0), -12.0);
  EXPECT_EQ(w.get(1), -1.0);
  EXPECT_EQ(w.get(2), 12.0);
  EXPECT_EQ(w.get(3), 2.0);
  o->scale_bytes = {0};  // 2^-127: subnormal in f32, still exact
  const Tensor tiny = dequantize(over(o, QuantFormat::mxfp4, 1, 32, 32, 16, 1), DType::f64);
  EXPECT_EQ(tiny.get(1), -std::ldexp(1.0, -128));
}

TEST(Quant, RowDecodeEqualsOracle) {
  Rng rng(7);
  for (QuantFormat f : {QuantFormat::int4, QuantFormat::int8, QuantFormat::mxfp4, QuantFormat::fp8}) {
    const QuantMatrix q = random_quant(f, 131, 300, rng);
    const Tensor want = dequantize(q, DType::f32);
    std::vector<float> got(300);
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t r = int64_t(rng.below(131)), c0 = int64_t(rng.below(300));
      const int64_t n = 1 + int64_t(rng.below(uint64_t(300 - c0)));
      dequantize_row(q, r, c0, n, got.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[size_t(i)], want.data<float>()[r * 300 + c0 + i])
            << quant_format_name(f) << " row " << r << " col " << c0 + i;
      }
    }
  }
}

// The bf16 decoder (vector paths) equals the oracle rounded, bit for bit,
// over every code: NaN codes and all E8M0 exponents included.
TEST(Quant, Bf16RowDecodeEqualsOracle) {
  Rng rng(13);
  for (QuantFormat f : {QuantFormat::int4, QuantFormat::int8, QuantFormat::mxfp4, QuantFormat::fp8}) {
    QuantMatrix q = random_quant(f, 131, 300, rng);
    auto o = std::make_shared<Owned>();
    if (f == QuantFormat::fp8 || f == QuantFormat::mxfp4) {
      // Every byte value, NaN codes included, and every exponent.
      const bool mx = f == QuantFormat::mxfp4;
      o->codes.resize(size_t(131 * q.code_stride));
      for (size_t i = 0; i < o->codes.size(); ++i) o->codes[i] = uint8_t(i * 7);
      o->scales.assign(size_t(q.scale_rows() * q.scale_stride), 0.75f);
      o->scale_bytes.resize(size_t(131 * q.scale_stride));
      for (size_t i = 0; i < o->scale_bytes.size(); ++i) o->scale_bytes[i] = uint8_t(i * 3);
      q = over(o, f, 131, 300, mx ? 32 : 128, q.code_stride, q.scale_stride);
    }
    const Tensor want = dequantize(q, DType::bf16);
    std::vector<bf16> got(300);
    for (int trial = 0; trial < 300; ++trial) {
      const int64_t r = int64_t(rng.below(131)), c0 = trial < 131 ? 0 : int64_t(rng.below(300));
      const int64_t n = trial < 131 ? 300 : 1 + int64_t(rng.below(uint64_t(300 - c0)));
      const int64_t row = trial < 131 ? trial : r;
      dequantize_row_bf16(q, row, c0, n, got.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[size_t(i)].bits, want.data<bf16>()[row * 300 + c0 + i].bits)
            << quant_format_name(f) << " row " << row << " col " << c0 + i;
      }
    }
  }
}

TEST(Quant, IntQuantizerBounds) {
  Rng rng(11);
  const Tensor w = random_tensor({9, 70}, DType::f32, rng, 2.0);  // a partial last group
  // Group 32, and 5: odd groups, half of them starting mid-byte.
  for (const auto [f, group] : {std::pair{QuantFormat::int4, 32}, std::pair{QuantFormat::int8, 32},
                                std::pair{QuantFormat::int4, 5}}) {
    const QuantMatrix q = quantize_int(w, f, group);
    EXPECT_EQ(q.scale_cols(), (70 + group - 1) / group);
    const Tensor d = dequantize(q, DType::f64);
    const float* s = static_cast<const float*>(q.scales);
    for (int64_t r = 0; r < 9; ++r) {
      for (int64_t c = 0; c < 70; ++c) {
        const double scale = s[r * q.scale_stride + c / group];
        EXPECT_EQ(double(bf16_to_float(float_to_bf16(float(scale)))), scale);  // a bf16 scale
        // Half a step, plus what the scale's rounding to bf16 (2^-9
        // relative) moves the largest codes, which may then saturate, plus
        // the value's own rounding to bf16 (bf16_values).
        const double x = w.get(r * 70 + c);
        EXPECT_LE(std::abs(d.get(r * 70 + c) - x),
                  scale * 0.5 + std::abs(x) * 0x1p-8 + (std::abs(x) + scale) * 0x1p-9)
            << quant_format_name(f) << " g" << group << " at " << r << ", " << c;
      }
    }
  }
  // An all-zero group decodes to zeros.
  const QuantMatrix z = quantize_int(Tensor::zeros({2, 32}, DType::f32), QuantFormat::int4, 32);
  EXPECT_EQ(dequantize(z, DType::f64).to_vector(), std::vector<double>(64, 0.0));
}

// quantize_mxfp4 against a brute-force reading of the OCP rule: the block's
// exponent from its largest magnitude, each value the nearest of the 16
// codes (ties to the even code), blocks of zeros and of huge or tiny values.
TEST(Quant, Mxfp4QuantizerPicksTheNearestCode) {
  Rng rng(19);
  Tensor w = random_tensor({6, 128}, DType::f32, rng, 1.0);
  for (int64_t c = 0; c < 32; ++c) {
    w.set(c, 0.0);                           // row 0, block 0: zeros
    w.set(128 + c, w.get(128 + c) * 1e30);   // row 1, block 0: huge
    w.set(256 + c, w.get(256 + c) * 1e-30);  // row 2, block 0: tiny
  }
  w.set(3 * 128 + 5, 2.5);  // a tie between 2 and 3 under e = 0 ...
  w.set(3 * 128 + 6, 7.0);  // ... with 7 setting the exponent; 7 saturates to 6
  const QuantMatrix q = quantize_mxfp4(w);
  const Tensor d = dequantize(q, DType::f64);
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t b = 0; b < 4; ++b) {
      double amax = 0;
      for (int64_t c = 0; c < 32; ++c) amax = std::max(amax, std::abs(w.get(r * 128 + b * 32 + c)));
      const int e =
          amax == 0 ? -127 : std::clamp(int(std::floor(std::log2(float(amax)))) - 2, -127, 127);
      for (int64_t c = 0; c < 32; ++c) {
        const double x = w.get(r * 128 + b * 32 + c);
        int best = 0;
        for (int code = 1; code < 16; ++code) {
          const double dv = std::abs(std::ldexp(kE2m1Values[code], e) - x);
          const double db = std::abs(std::ldexp(kE2m1Values[best], e) - x);
          if (dv < db || (dv == db && code % 2 == 0 && (code & 8) == (best & 8))) best = code;
        }
        ASSERT_EQ(std::abs(d.get(r * 128 + b * 32 + c)), std::abs(std::ldexp(kE2m1Values[best], e)))
            << "row " << r << " col " << b * 32 + c << " of " << x;
      }
    }
  }
  EXPECT_EQ(d.get(3 * 128 + 5), 2.0);  // the tie went to the even code
  EXPECT_EQ(d.get(3 * 128 + 6), 6.0);
}

// An expert's gate over its up: the parts' rows in order, fp8's 128-row
// scale blocks kept only when the first part ends on one.
TEST(Quant, StackedRowsEqualTheirParts) {
  Rng rng(17);
  const std::pair<QuantFormat, std::pair<int64_t, int64_t>> cases[] = {
      {QuantFormat::fp8, {130, 130}}, {QuantFormat::fp8, {128, 130}}, {QuantFormat::int4, {7, 9}}};
  for (const auto& [f, rows] : cases) {
    const QuantMatrix a = random_quant(f, rows.first, 300, rng);
    const QuantMatrix b = random_quant(f, rows.second, 300, rng);
    const QuantMatrix s = stack_quant_rows({a, b});
    EXPECT_EQ(s.rows, a.rows + b.rows);
    EXPECT_EQ(s.row_group, f == QuantFormat::fp8 && a.rows % 128 == 0 ? 128 : 1);
    EXPECT_EQ(s.bf16_values, a.bf16_values);
    const Tensor want_a = dequantize(a, DType::f32), want_b = dequantize(b, DType::f32);
    const Tensor got = dequantize(s, DType::f32);
    EXPECT_TRUE(bitwise_equal(got.rows(0, a.rows), want_a)) << quant_format_name(f);
    EXPECT_TRUE(bitwise_equal(got.rows(a.rows, s.rows), want_b)) << quant_format_name(f);
  }
}

TEST(Quant, BadMatricesNameThemselves) {
  auto o = std::make_shared<Owned>();
  o->codes.assign(64, 0);
  o->scale_bytes.assign(4, 127);
  QuantMatrix q = over(o, QuantFormat::mxfp4, 2, 64, 16, 32, 2);  // mxfp4 blocks are 32
  EXPECT_THROW(
      {
        try {
          check_quant_matrix(q, "layers.0.experts.w13");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("layers.0.experts.w13"), std::string::npos);
          throw;
        }
      },
      Error);
  q.group = 32;
  q.code_stride = 16;  // a row of 64 needs 32 bytes
  EXPECT_THROW(check_quant_matrix(q, "w"), Error);
  EXPECT_THROW(parse_quant_format("nf4", "--experts"), Error);
}

// ---- The grouped products over quantized weights ----

struct Case {
  CpuIsa isa;
  DType dtype;
  QuantFormat format;
};

std::vector<Case> all_cases() {
  std::vector<Case> v;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512bf16, CpuIsa::amx,
                     CpuIsa::avx512_emu, CpuIsa::avx512bf16_emu, CpuIsa::amx_emu}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      for (QuantFormat f :
           {QuantFormat::int4, QuantFormat::int8, QuantFormat::mxfp4, QuantFormat::fp8}) {
        v.push_back({isa, dt, f});
      }
    }
  }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string isa(cpu_isa_name(info.param.isa));
  for (char& c : isa) c = c == '-' ? '_' : c;
  return isa + "_" + std::string(dtype_name(info.param.dtype)) + "_" +
         std::string(quant_format_name(info.param.format));
}

struct Shape3;
class QuantGrouped : public testing::IsaTest<Case> {
 protected:
  void check_layer(const Shape3& shape);
};
INSTANTIATE_TEST_SUITE_P(Isa, QuantGrouped, ::testing::ValuesIn(all_cases()), case_name);

// The layers: rows per group none, one, around a tile, past a block of
// rows and past a tall block (gemm::tall_rows, where a panel is expanded
// again). D = 270 and 2F = 300 take two steps of K (256) and, as dx's
// columns, two blocks of them, and are multiples of no scale group; D = 320
// and F = 160 are multiples of 32, the runs the AVX-512 nibble expansion
// takes (quant_pack.h), whole groups of int4 g32 and MXFP4.
struct Shape3 {
  int64_t D, F;
  std::vector<int64_t> rows;
};
const Shape3 kShapes[] = {{270, 150, {0, 1, 17, 130, 1100}}, {320, 160, {1, 40}}};

TEST_P(QuantGrouped, EqualsTheDequantizedProductsBitwise) {
  for (const Shape3& shape : kShapes) {
    SCOPED_TRACE("D " + std::to_string(shape.D) + ", F " + std::to_string(shape.F));
    check_layer(shape);
  }
}

void QuantGrouped::check_layer(const Shape3& shape) {
  const DType dt = GetParam().dtype;
  const QuantFormat f = GetParam().format;
  const int64_t kD = shape.D, kF = shape.F;
  Rng rng(uint64_t(f) * 100 + uint64_t(kD));
  const int64_t G = int64_t(shape.rows.size());
  std::vector<int64_t> offset{0};
  for (int64_t r : shape.rows) offset.push_back(offset.back() + r);
  const int64_t N = offset.back();
  std::vector<QuantMatrix> q13, q2;
  std::vector<Tensor> d13, d2;  // dequantized to the products' dtype
  for (int64_t g = 0; g < G; ++g) {
    q13.push_back(random_quant(f, 2 * kF, kD, rng));
    q2.push_back(random_quant(f, kD, kF, rng));
    d13.push_back(dequantize(q13.back(), dt));
    d2.push_back(dequantize(q2.back(), dt));
  }
  const Tensor x = random_tensor({N, kD}, dt, rng), dy = random_tensor({N, kD}, dt, rng);
  const Tensor score = random_tensor({N}, DType::f32, rng);
  const Tensor b2 = random_tensor({G, kD}, dt, rng, 0.5);
  const Tensor dh = random_tensor({N, 2 * kF}, dt, rng), as = random_tensor({N, kF}, dt, rng);
  for (Glu glu : {Glu{GluKind::swiglu}, Glu{GluKind::clamped, 1.702, 7.0}}) {
    PackedWeights qw, dw;
    qw.bind_quantized(q13, dt, PackUse::forward_glu, glu);
    dw.pack(d13, dt, PackUse::forward_glu, glu);
    EXPECT_EQ(qw.bytes(), 0);  // nothing widened is kept
    Tensor h[2], a[2], s[2];
    for (int i = 0; i < 2; ++i) {
      h[i] = Tensor::empty({N, 2 * kF}, dt);
      a[i] = Tensor::empty({N, kF}, dt);
      s[i] = Tensor::empty({N, kF}, dt);
    }
    cpu::grouped_glu_forward(h[0], a[0], s[0], x, offset, qw, Tensor(), score);
    cpu::grouped_glu_forward(h[1], a[1], s[1], x, offset, dw, Tensor(), score);
    const std::string kind = glu.kind == GluKind::swiglu ? "swiglu" : "clamped";
    EXPECT_TRUE(bitwise_equal(h[0], h[1], kind + " h"));
    EXPECT_TRUE(bitwise_equal(s[0], s[1], kind + " a*score"));
  }
  struct Product {
    const char* name;
    std::vector<QuantMatrix>* q;
    std::vector<Tensor>* d;
    PackUse use;
    Tensor in;
    int64_t out_cols;
  };
  for (const Product& p : {Product{"w2 forward", &q2, &d2, PackUse::forward, as, kD},
                           Product{"w2 dx", &q2, &d2, PackUse::backward_dx, dy, kF},
                           Product{"w13 dx", &q13, &d13, PackUse::backward_dx, dh, kD}}) {
    PackedWeights qw, dw;
    qw.bind_quantized(*p.q, dt, p.use);
    dw.pack(*p.d, dt, p.use);
    Tensor got = Tensor::empty({N, p.out_cols}, dt), want = Tensor::empty({N, p.out_cols}, dt);
    const bool bias = p.use == PackUse::forward;
    cpu::grouped_matmul(got, p.in, offset, qw, bias ? b2 : Tensor(), bias ? score : Tensor());
    cpu::grouped_matmul(want, p.in, offset, dw, bias ? b2 : Tensor(), bias ? score : Tensor());
    EXPECT_TRUE(bitwise_equal(got, want, p.name));
    // The ref twin reads the dequantized weight: equal within f32 sums' order.
    Tensor r = Tensor::empty({N, p.out_cols}, dt);
    ref::grouped_matmul(r, p.in, offset, qw, bias ? b2 : Tensor(), bias ? score : Tensor());
    for (int64_t i = 0; i < got.numel(); ++i) {
      const double g = got.get(i), w = r.get(i);
      ASSERT_LE(std::abs(g - w), (dt == DType::bf16 ? 0x1p-6 : 1e-4) * (1 + std::abs(w)))
          << p.name << " vs ref at flat " << i;
    }
  }
}

}  // namespace
}  // namespace tiermoe
