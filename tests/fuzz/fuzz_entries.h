#pragma once
// The fuzz targets' entry points: one input through the readers a target
// covers, as a user's file would reach them. Shared by the libFuzzer targets
// (tests/fuzz/fuzz_main.cpp, `make fuzz`) and the corpus replay that
// `make test` runs (tests/fuzz/test_fuzz_replay.cpp), so the replay feeds
// every corpus file to exactly the code the fuzzer ran.
//
// A reader may accept an input or reject it with tiermoe::Error; anything
// else (another exception, a crash, a sanitizer report, a hang or a huge
// allocation) is a finding. run_fuzz_input lets every non-Error exception
// escape.
//
// Targets that read several files (a sharded checkpoint, a PEFT adapter)
// take them from one input split at kFuzzPartSeparator.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tiermoe::fuzz {

enum class FuzzTarget { safetensors, shard_index, config, tokens, peft, profile, sft, metrics };

inline constexpr FuzzTarget kFuzzTargets[] = {
    FuzzTarget::safetensors, FuzzTarget::shard_index, FuzzTarget::config, FuzzTarget::tokens,
    FuzzTarget::peft,        FuzzTarget::profile,     FuzzTarget::sft,    FuzzTarget::metrics};

// "safetensors", "shard_index", ... (the corpus folder and binary suffix).
std::string_view fuzz_target_name(FuzzTarget target);
std::optional<FuzzTarget> fuzz_target_from_name(std::string_view name);

inline constexpr std::string_view kFuzzPartSeparator = "\n--8<--\n";

// Splits at kFuzzPartSeparator (at most `max_parts`; the last part keeps any
// further separators).
std::vector<std::string_view> split_fuzz_parts(std::string_view data, size_t max_parts);

// Writes the input's files under `scratch` (a directory the caller owns; it
// is emptied first) and runs the target's readers on them.
void run_fuzz_input(FuzzTarget target, std::span<const uint8_t> data,
                    const std::filesystem::path& scratch);

}  // namespace tiermoe::fuzz
