#pragma once
// Sizes that come from files and flags, checked before anything is
// allocated: a product that overflows int64, or a request larger than the
// host's memory, is an Error naming its source and saying how much it would
// take, never a wrapped count, a bad_alloc or minutes of swapping.
#include <cstdint>
#include <initializer_list>
#include <string>

namespace tiermoe {

// a * b and a + b, or an Error "<what> overflows ..." at `where` when the
// result does not fit int64 (the operands are sizes: both >= 0).
int64_t checked_mul(int64_t a, int64_t b, const std::string& what, const std::string& where);
int64_t checked_add(int64_t a, int64_t b, const std::string& what, const std::string& where);
// The product of every factor, checked as checked_mul.
int64_t checked_product(std::initializer_list<int64_t> factors, const std::string& what,
                        const std::string& where);

// An integer in [lo, hi], or an Error naming `name` (a flag or a field) with
// the range and `hint`.
void check_in_range(int64_t value, int64_t lo, int64_t hi, const std::string& name,
                    const std::string& hint);

// Bytes a new allocation can take without swapping: MemAvailable from
// /proc/meminfo, or the physical pages sysconf reports where that is absent.
uint64_t host_memory_available();

// "61.06 GB", "3.20 MB", "512 B": decimal units, as the CLI prints sizes.
std::string format_size(uint64_t bytes);

// Throws when `bytes` exceed host_memory_available(): "<what> needs at least
// N GB of host memory, M GB are available" at `where`, with `hint`.
void check_host_memory(uint64_t bytes, const std::string& what, const std::string& where,
                       const std::string& hint);

}  // namespace tiermoe
