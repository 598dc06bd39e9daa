// One libFuzzer target (TIERMOE_FUZZ_TARGET names it, e.g. safetensors):
// built by tests/fuzz/CMakeLists.txt with clang's -fsanitize=fuzzer, run by
// `make fuzz`. A non-Error exception escapes and aborts: libFuzzer saves the
// input as a finding.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_entries.h"

namespace {

const std::filesystem::path& scratch() {
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("tiermoe_fuzz_" TIERMOE_FUZZ_TARGET "_" + std::to_string(::getpid()));
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tiermoe::fuzz::FuzzTarget target = [] {
    auto t = tiermoe::fuzz::fuzz_target_from_name(TIERMOE_FUZZ_TARGET);
    if (!t) {
      std::fprintf(stderr, "unknown fuzz target %s\n", TIERMOE_FUZZ_TARGET);
      std::abort();
    }
    return *t;
  }();
  tiermoe::fuzz::run_fuzz_input(target, {data, size}, scratch());
  return 0;
}
