#include <gtest/gtest.h>

#include "tiermoe/core/parallel.h"
#include "tiermoe/core/random.h"
#include "tiermoe/core/tensor.h"

using namespace tiermoe;

TEST(Tensor, EmptyIsAlignedAndTracked) {
  MemoryTracker tracker;
  {
    Tensor t = Tensor::empty({3, 5}, DType::f32, MemTag::weights, tracker);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
    EXPECT_EQ(t.numel(), 15);
    EXPECT_EQ(t.nbytes(), 60u);
    EXPECT_EQ(tracker.live(MemTag::weights), 60u);
    Tensor copy = t;  // shares storage: no new bytes
    EXPECT_EQ(tracker.live_total(), 60u);
  }
  EXPECT_EQ(tracker.live(MemTag::weights), 0u);
  EXPECT_EQ(tracker.peak(MemTag::weights), 60u);
}

TEST(Tensor, RetagMovesBytesBetweenTags) {
  MemoryTracker tracker;
  Tensor t = Tensor::zeros({4, 4}, DType::bf16, MemTag::activations, tracker);
  t.retag(MemTag::saved);
  EXPECT_EQ(tracker.live(MemTag::activations), 0u);
  EXPECT_EQ(tracker.live(MemTag::saved), 32u);
  EXPECT_EQ(tracker.live_total(), 32u);
  t = Tensor();
  EXPECT_EQ(tracker.live(MemTag::saved), 0u);
  EXPECT_EQ(tracker.peak(MemTag::activations), 32u);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_values({3, 2}, DType::f64, {0, 1, 2, 3, 4, 5});
  Tensor r = t.rows(1, 3);
  EXPECT_EQ(r.shape(), (Shape{2, 2}));
  EXPECT_EQ(r.get(0), 2.0);
  r.set(3, 42.0);
  EXPECT_EQ(t.get(5), 42.0);
  EXPECT_EQ(t.select(2).shape(), (Shape{2}));
  EXPECT_EQ(t.view({6}).get(4), 4.0);
  EXPECT_THROW(t.view({4}), Error);
  EXPECT_THROW(t.rows(2, 4), Error);
}

TEST(Tensor, ConversionRoundsLikeBf16) {
  Tensor t = Tensor::from_values({3}, DType::f32, {1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, -7.25});
  Tensor b = t.to(DType::bf16);
  EXPECT_EQ(b.get(0), 1.0);
  EXPECT_EQ(b.get(1), 1.0 + 0x1p-6);
  EXPECT_EQ(b.get(2), -7.25);
  EXPECT_EQ(b.data<bf16>()[0].bits, 0x3f80);
  EXPECT_THROW(b.data<float>(), Error);
}

TEST(Tensor, ShapeChecksNameTheTensor) {
  Tensor t = Tensor::zeros({2, 3}, DType::f32);
  EXPECT_NO_THROW(check_shape(t, {2, 3}, "x_TD"));
  try {
    check_shape(t, {2, 4}, "x_TD");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x_TD: expected shape [2, 4], got f32[2, 3]"),
              std::string::npos);
  }
  EXPECT_THROW(Tensor::empty({-1}, DType::f32), Error);
  EXPECT_THROW(Tensor::empty({int64_t(1) << 40, int64_t(1) << 40}, DType::f32), Error);
}

TEST(Rng, DeterministicAndRestorable) {
  Rng a(7), b(7);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  auto saved = a.state();
  double x = a.normal();
  a.set_state(saved);
  EXPECT_EQ(a.normal(), x);
  Rng c(8);
  EXPECT_NE(Rng(7).next_u64(), c.next_u64());
}

TEST(Rng, NormalHasUnitMoments) {
  Rng r(1);
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double v = r.normal();
    s += v;
    s2 += v * v;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
}

TEST(Parallel, CoversRangeExactlyOnce) {
  std::vector<int> hits(1001, 0);
  parallel_for(1001, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
  int before = num_threads();
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(0);
  EXPECT_EQ(num_threads(), default_num_threads());
  set_num_threads(before);
}
