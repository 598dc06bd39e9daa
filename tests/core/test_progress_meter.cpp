// The progress meter's output on a fake clock: quiet lines (not a terminal)
// every quarter of the work or every 30 s, nothing for work shorter than the
// delay, the terminal line's rate limit, and the line format.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tiermoe/core/progress_meter.h"

namespace tiermoe {
namespace {

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

struct FakeClock {
  double t = 100;
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

TEST(ProgressMeter, QuietLinesEveryQuarterAndALastLine) {
  FakeClock clock;
  std::ostringstream out;
  ProgressMeter m({&out, false}, "load ckpt", 100e9, {.clock = clock.fn()});
  // 1 GB a second for 100 s, reported every 1/8 s: 800 updates.
  for (int i = 1; i <= 800; ++i) {
    clock.t += 0.125;
    m.update(i * 0.125e9);
  }
  m.finish();
  const std::vector<std::string> l = lines_of(out.str());
  // At 1 s (the delay), then each 25 GB more (sooner than 30 s), then done:
  // the last 24 GB made no line of their own.
  ASSERT_EQ(l.size(), 5u) << out.str();
  EXPECT_EQ(l[0], "load ckpt: 1% (1.00 GB of 100 GB), 1.00 GB/s, ETA 1:39");
  EXPECT_EQ(l[1], "load ckpt: 26% (26.0 GB of 100 GB), 1.00 GB/s, ETA 1:14");
  EXPECT_EQ(l[2], "load ckpt: 51% (51.0 GB of 100 GB), 1.00 GB/s, ETA 0:49");
  EXPECT_EQ(l[3], "load ckpt: 76% (76.0 GB of 100 GB), 1.00 GB/s, ETA 0:24");
  EXPECT_EQ(l[4], "load ckpt: done, 100 GB in 1:40");
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(ProgressMeter, SlowWorkGetsALineEveryThirtySeconds) {
  FakeClock clock;
  std::ostringstream out;
  ProgressMeter m({&out, false}, "init", 10, {.unit = "shards", .clock = clock.fn()});
  // One shard every 20 s: 10% each, so the 30 s rule makes the lines.
  for (int i = 1; i <= 10; ++i) {
    clock.t += 20;
    m.update(i);
  }
  m.finish();
  const std::vector<std::string> l = lines_of(out.str());
  // Lines at 20 s, then 60 s (the first update 30 s or more later), 100,
  // 140 and 180 s, and done.
  ASSERT_EQ(l.size(), 6u) << out.str();
  EXPECT_EQ(l[0], "init: 10% (1 of 10 shards), ETA 3:00");
  EXPECT_EQ(l[1], "init: 30% (3 of 10 shards), ETA 2:20");
  EXPECT_EQ(l.back(), "init: done, 10 shards in 3:20");
}

TEST(ProgressMeter, WorkShorterThanTheDelayPrintsNothing) {
  FakeClock clock;
  std::ostringstream out;
  ProgressMeter m({&out, false}, "load", 1000, {.clock = clock.fn()});
  for (int i = 1; i <= 9; ++i) {
    clock.t += 0.1;
    m.update(i * 100);
  }
  m.update(1000);
  m.finish();
  EXPECT_EQ(out.str(), "");
}

TEST(ProgressMeter, TheTerminalLineIsRewrittenAtMostFourTimesASecond) {
  FakeClock clock;
  std::ostringstream out;
  {
    ProgressMeter m({&out, true}, "tier: measuring", 10, {.unit = "stages", .clock = clock.fn()});
    clock.t += 1.0;                  // past the delay
    for (int i = 1; i <= 64; ++i) {  // 64 updates in 1 s
      clock.t += 1.0 / 64;
      m.update(i * 10.0 / 64);
    }
    m.finish();
  }
  const std::string s = out.str();
  size_t rewrites = 0;
  for (char c : s) rewrites += c == '\r';
  // At 1 s + 1/64, then each 0.25 s later (3 more within the second); then done.
  EXPECT_EQ(rewrites, 5u) << s;
  EXPECT_NE(s.find("\x1b[K"), std::string::npos);  // erases what a longer line left
  EXPECT_EQ(s.back(), '\n');                       // the line is ended
  EXPECT_NE(s.find("tier: measuring: done, 10 stages in 0:02"), std::string::npos) << s;
}

TEST(ProgressMeter, NoSinkNoOutputAndAnOpenLineIsEndedOnUnwind) {
  ProgressMeter silent({}, "x", 1);
  silent.update(1);
  silent.finish();
  FakeClock clock;
  std::ostringstream out;
  {
    ProgressMeter m({&out, true}, "load", 10, {.clock = clock.fn()});
    clock.t += 2;
    m.update(5);
    // No finish(): an exception left the work half done.
  }
  EXPECT_EQ(out.str().back(), '\n');
  EXPECT_EQ(out.str().find("done"), std::string::npos);
}

}  // namespace
}  // namespace tiermoe
