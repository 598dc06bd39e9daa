#pragma once
// Wall time for figures (step times, the device tier's time split): a
// monotonic clock, never the calendar.
#include <chrono>

namespace tiermoe {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace tiermoe
