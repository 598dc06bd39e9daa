// `make test`'s replay of the checked-in fuzz corpus (tests/fuzz/corpus/<target>/):
// every file goes through the same entry point the libFuzzer target runs
// (fuzz_entries.h). A reader must accept it or reject it with tiermoe::Error;
// any other exception fails the test naming the file. Crashes and sanitizer
// reports fail it too (`make test-sanitize` runs it under ASan and UBSan).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "fuzz/fuzz_entries.h"
#include "tiermoe/core/error.h"

namespace tiermoe::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

class FuzzReplay : public ::testing::TestWithParam<FuzzTarget> {};

TEST_P(FuzzReplay, EveryCorpusFileIsAcceptedOrRejectedWithAnError) {
  const FuzzTarget target = GetParam();
  const fs::path dir = fs::path(TIERMOE_FUZZ_CORPUS_DIR) / fuzz_target_name(target);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), size_t(5)) << dir << " holds too small a seed corpus";
  const fs::path scratch =
      fs::temp_directory_path() / ("tiermoe_fuzz_replay_" + std::string(fuzz_target_name(target)) +
                                   "_" + std::to_string(::getpid()));
  for (const fs::path& f : files) {
    const std::vector<uint8_t> bytes = slurp(f);
    try {
      run_fuzz_input(target, bytes, scratch);
    } catch (const std::exception& e) {
      ADD_FAILURE() << f.filename() << ": " << typeid(e).name() << ": " << e.what();
    }
  }
  fs::remove_all(scratch);
}

INSTANTIATE_TEST_SUITE_P(Corpus, FuzzReplay, ::testing::ValuesIn(kFuzzTargets),
                         [](const auto& info) {
                           return std::string(fuzz_target_name(info.param));
                         });

TEST(FuzzParts, SplitKeepsFurtherSeparatorsInTheLastPart) {
  const std::string sep(kFuzzPartSeparator);
  const std::string in = "a" + sep + "b" + sep + "c";
  EXPECT_EQ(split_fuzz_parts(in, 2), (std::vector<std::string_view>{"a", "b" + sep + "c"}));
  EXPECT_EQ(split_fuzz_parts(in, 3), (std::vector<std::string_view>{"a", "b", "c"}));
  EXPECT_EQ(split_fuzz_parts("abc", 3), (std::vector<std::string_view>{"abc"}));
}

}  // namespace
}  // namespace tiermoe::fuzz
