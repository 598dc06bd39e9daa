#pragma once
// Bounds on numeric flags, as CLI11 validators: a value out of range is a
// command-line error (exit 2) naming the flag, its range and why, before any
// subcommand runs. Shared by every subcommand so a bound reads the same
// everywhere.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace tiermoe::cli {

// Counts: tokens, steps, batch rows. Far above anything a run uses, low
// enough that a product of two (batch x seq_len) cannot overflow int64.
inline constexpr int64_t kMaxCount = int64_t(1) << 31;

// An integer in [lo, hi]; `why` says where the bound comes from.
CLI::Validator count_in(int64_t lo, int64_t hi, const std::string& why = {});

// A finite number in [lo, hi] (either may be +-infinity for "no bound").
CLI::Validator number_in(double lo, double hi, const std::string& why = {});

// Every integer flag of `app` and its subcommands, read in base 10 (CLI11
// reads "010" as octal 8 and "0x10" as 16) and within its type's range (a
// negative or too large value is refused, not wrapped): leading zeros are
// dropped, anything but an optional sign and digits is refused. Call once
// every option is added. Number flags likewise take only finite numbers
// (CLI11 reads '' as 0 and takes inf and nan).
void integers_in_base_10(CLI::App& app);

// The most threads --threads (and --device-threads) take: 4 x the cores this
// process may run on. More threads than that only oversubscribe the cores
// (OpenMP threads spin-wait), and past a few thousand libgomp cannot create
// them at all (it crashes or exits with "Thread creation failed").
int max_threads();

// OMP_NUM_THREADS sets the default thread count the same way, so a value
// past max_threads() is held to the cores, with a warning on stderr.
void bound_omp_num_threads();

}  // namespace tiermoe::cli
