#include "tiermoe/core/bounds.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <limits>

#include "tiermoe/core/error.h"

namespace tiermoe {

using detail::str_of;

int64_t checked_mul(int64_t a, int64_t b, const std::string& what, const std::string& where) {
  int64_t out = 0;
  TIERMOE_CHECK(!__builtin_mul_overflow(a, b, &out),
                str_of(what, " overflows 64 bits (", a, " x ", b, ")"), where,
                "one of its sizes is far larger than any real model's; check the value");
  return out;
}

int64_t checked_add(int64_t a, int64_t b, const std::string& what, const std::string& where) {
  int64_t out = 0;
  TIERMOE_CHECK(!__builtin_add_overflow(a, b, &out),
                str_of(what, " overflows 64 bits (", a, " + ", b, ")"), where,
                "one of its sizes is far larger than any real model's; check the value");
  return out;
}

int64_t checked_product(std::initializer_list<int64_t> factors, const std::string& what,
                        const std::string& where) {
  int64_t out = 1;
  for (int64_t f : factors) out = checked_mul(out, f, what, where);
  return out;
}

void check_in_range(int64_t value, int64_t lo, int64_t hi, const std::string& name,
                    const std::string& hint) {
  TIERMOE_CHECK(value >= lo && value <= hi,
                str_of(name, " is ", value, ", outside [", lo, ", ", hi, "]"), name, hint);
}

uint64_t host_memory_available() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) return uint64_t(kib) * 1024;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) return uint64_t(pages) * uint64_t(page);
  // Unknown: nothing is refused here; the allocator reports what fails.
  return std::numeric_limits<uint64_t>::max();
}

std::string format_size(uint64_t bytes) {
  static const char* const units[] = {"KB", "MB", "GB"};
  char buf[48];
  if (bytes < 1000) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    return buf;
  }
  // Up to GB only: a refused run's parts read in one unit (19966.91 GB).
  double v = double(bytes) / 1e3;
  int u = 0;
  while (v >= 1000 && u < 2) v /= 1000, ++u;
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

void check_host_memory(uint64_t bytes, const std::string& what, const std::string& where,
                       const std::string& hint) {
  const uint64_t available = host_memory_available();
  TIERMOE_CHECK(bytes <= available,
                str_of(what, " needs at least ", format_size(bytes), " of host memory, ",
                       format_size(available), " are available"),
                where, hint);
}

}  // namespace tiermoe
