#pragma once
// The test fixture that runs the built tiermoe binary (TIERMOE_CLI_PATH) as a
// user would, in a fresh temporary directory per test.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace tiermoe {

namespace fs = std::filesystem;

struct RunResult {
  int rc = -1;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tiermoe_test_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path path(const std::string& name) const { return dir_ / name; }

  // Runs `tiermoe <args>`; each argument is passed verbatim (single-quoted).
  RunResult run(const std::vector<std::string>& args) const {
    std::string cmd = std::string("'") + TIERMOE_CLI_PATH + "'";
    for (const auto& a : args) cmd += " '" + a + "'";
    cmd += " >'" + path("stdout").string() + "' 2>'" + path("stderr").string() + "'";
    int status = std::system(cmd.c_str());
    RunResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(path("stdout"));
    r.err = slurp(path("stderr"));
    return r;
  }

  // `tiermoe init` into dir/name; fails the test on a non-zero exit.
  fs::path init(const std::string& name, std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"init", "--preset", "tiny", "--out", path(name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << r.err;
    return path(name);
  }

  fs::path dir_;
};

// The JSON object a --json command prints as its last non-empty stdout line.
inline nlohmann::json last_json_line(const std::string& out) {
  std::istringstream in(out);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return nlohmann::json::parse(last);
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace tiermoe
