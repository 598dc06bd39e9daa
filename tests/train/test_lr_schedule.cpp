// Learning-rate schedules: HF get_cosine_schedule_with_warmup (and its
// min-lr variant) and constant-with-warmup, at the points that define them.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "tiermoe/core/error.h"
#include "tiermoe/train/lr_schedule.h"

namespace tiermoe {
namespace {

TEST(LrSchedule, CosineWithWarmup) {
  LrSchedule s({.kind = LrScheduleKind::cosine, .base_lr = 3e-4, .warmup_steps = 10, .total_steps = 110});
  EXPECT_EQ(s.lr(0), 0.0);  // HF: the first update uses lambda(0)
  EXPECT_DOUBLE_EQ(s.lr(5), 1.5e-4);
  EXPECT_DOUBLE_EQ(s.lr(10), 3e-4);  // warmup end: the peak
  EXPECT_DOUBLE_EQ(s.lr(60), 1.5e-4);  // half way through the cosine
  EXPECT_DOUBLE_EQ(s.lr(35), 3e-4 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)));
  EXPECT_NEAR(s.lr(110), 0.0, 1e-20);
  EXPECT_NEAR(s.lr(500), 0.0, 1e-20);  // held at the minimum past the end
  for (int64_t t = 11; t <= 110; ++t) EXPECT_LE(s.lr(t), s.lr(t - 1)) << t;
}

TEST(LrSchedule, CosineWithMinLrRatio) {
  LrSchedule s({.kind = LrScheduleKind::cosine, .base_lr = 1.0, .warmup_steps = 4, .total_steps = 8,
                .min_lr_ratio = 0.1});
  EXPECT_DOUBLE_EQ(s.lr(1), 0.25);
  EXPECT_DOUBLE_EQ(s.lr(4), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(6), 0.5 * 0.9 + 0.1);
  EXPECT_DOUBLE_EQ(s.lr(8), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(9), 0.1);
}

TEST(LrSchedule, NoWarmupStartsAtThePeak) {
  LrSchedule s({.kind = LrScheduleKind::cosine, .base_lr = 2.0, .warmup_steps = 0, .total_steps = 4});
  EXPECT_DOUBLE_EQ(s.lr(0), 2.0);
  EXPECT_DOUBLE_EQ(s.lr(2), 1.0);
}

TEST(LrSchedule, ConstantWithWarmup) {
  LrSchedule s({.kind = LrScheduleKind::constant, .base_lr = 1e-3, .warmup_steps = 4});
  EXPECT_EQ(s.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(2), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr(4), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr(1000000), 1e-3);
}

TEST(LrSchedule, RejectsBadOptions) {
  EXPECT_THROW(LrSchedule({.warmup_steps = 10, .total_steps = 5}), Error);
  EXPECT_THROW(LrSchedule({.base_lr = -1.0}), Error);
  EXPECT_THROW(LrSchedule({.total_steps = 10, .min_lr_ratio = 1.5}), Error);
  EXPECT_THROW(LrSchedule({}).lr(-1), Error);
  EXPECT_EQ(parse_lr_schedule("cosine"), LrScheduleKind::cosine);
  EXPECT_EQ(parse_lr_schedule("constant"), LrScheduleKind::constant);
  EXPECT_THROW(parse_lr_schedule("linear"), Error);
}

}  // namespace
}  // namespace tiermoe
