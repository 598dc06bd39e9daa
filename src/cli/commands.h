#pragma once
// The tiermoe subcommands. Each file adds one subcommand to the app; main.cpp
// lists them, so a new subcommand is one line there. A subcommand throws
// tiermoe::Error on failure and main turns it into `error: ...` and exit 1.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <string>

#include "tiermoe/core/progress_meter.h"

namespace tiermoe::cli {

void add_init_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
// bench expert-kernels, under the bench subcommand (bench_kernels.cpp).
void add_bench_expert_kernels(CLI::App* bench);
void add_bench_peak(CLI::App* bench);
void add_bench_gated_delta(CLI::App* bench);  // bench_gated_delta.cpp

// "61.06 GB", "512 B": decimal units, as disk sizes and shard limits are given.
std::string human_bytes(uint64_t bytes);
// "30.53 B", "3.35 M": a parameter count.
std::string human_count(int64_t n);
// Progress lines on stderr, rewritten in place when it is a terminal.
ProgressSink stderr_progress();
// Makes `out` ready for a checkpoint: refuses one already there (its
// config.json) without `force`, else removes its config, tensors and index,
// so no stale shard survives beside the new files (init.cpp).
void prepare_out_dir(const std::filesystem::path& out, bool force);
// Parses a byte count with an optional unit: 5000000000, 5GB, 500MB, 2GiB, 64KiB, 1TB, 1TiB.
uint64_t parse_bytes(const std::string& text, const std::string& flag);

}  // namespace tiermoe::cli
