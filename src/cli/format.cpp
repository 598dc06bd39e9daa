#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "tiermoe/core/error.h"

namespace tiermoe::cli {

namespace {
std::string scaled(double v, const char* const* units, int n_units, double step) {
  int u = 0;
  while (std::abs(v) >= step && u + 1 < n_units) v /= step, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}
}  // namespace

ProgressSink stderr_progress() { return {&std::cerr, ::isatty(STDERR_FILENO) == 1}; }

std::string human_bytes(uint64_t bytes) {
  static const char* const units[] = {"B", "KB", "MB", "GB", "TB"};
  return scaled(double(bytes), units, 5, 1000.0);
}

std::string human_count(int64_t n) {
  static const char* const units[] = {"", "K", "M", "B", "T"};
  std::string s = scaled(double(n), units, 5, 1000.0);
  if (s.back() == ' ') s.pop_back();
  return s;
}

uint64_t parse_bytes(const std::string& text, const std::string& flag) {
  size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    TIERMOE_CHECK(value <= (UINT64_MAX - 9) / 10, "byte count " + text + " overflows", flag,
                  "give a size below 2^64 bytes");
    value = value * 10 + uint64_t(text[i++] - '0');
  }
  std::string unit = text.substr(i);
  struct Unit {
    const char* name;
    uint64_t scale;
  };
  static const Unit units[] = {{"", 1},
                               {"B", 1},
                               {"KB", 1000},
                               {"MB", 1000'000},
                               {"GB", 1000'000'000},
                               {"TB", 1000'000'000'000},
                               {"KiB", 1ull << 10},
                               {"MiB", 1ull << 20},
                               {"GiB", 1ull << 30},
                               {"TiB", 1ull << 40}};
  for (const Unit& u : units) {
    if (i > 0 && unit == u.name) {
      TIERMOE_CHECK(value <= UINT64_MAX / u.scale, "byte count " + text + " overflows", flag,
                    "give a smaller size");
      return value * u.scale;
    }
  }
  throw Error("cannot read '" + text + "' as a byte count", flag,
              "give bytes as a number with an optional unit: 5000000000, 5GB, 500MB, 2GiB, 1TB");
}

}  // namespace tiermoe::cli
