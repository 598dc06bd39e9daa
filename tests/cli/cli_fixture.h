#pragma once
// The test fixture that runs the built tiermoe binary (TIERMOE_CLI_PATH) as a
// user would, in a fresh temporary directory per test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/test_dir.h"

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

// `tiermoe train` as a small, fast run (one layer of the tiny preset, 2 x 16
// tokens a step), then `extra`.
inline std::vector<std::string> quick(std::vector<std::string> extra) {
  std::vector<std::string> args = {"train", "--layers",  "1", "--batch",         "2",   "--seq-len",
                                   "16",    "--threads", "1", "--corpus-tokens", "4096"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Every file under dir (relative path -> bytes; "<dir>" for directories).
inline std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    files[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? slurp(e.path()) : "<dir>";
  }
  return files;
}

class Cli : public testing::DirTest {
 protected:
  Cli() : DirTest("tiermoe_test_cli_") {}

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

  // `tiermoe plan` of a synthetic profile for a preset cut to `layers`, with
  // fixed rates (nothing measured), then `extra` (--save-profile, --json).
  RunResult plan_synthetic(const std::string& preset, const std::string& layers,
                           std::vector<std::string> extra) const {
    std::vector<std::string> args = {"plan", "--preset",         preset, "--layers",
                                     layers, "--synthetic-zipf", "1",    "--tokens",
                                     "64",   "--device-memory",  "1GB",  "--host-tflops",
                                     "0.1",  "--device-tflops",  "1",    "--link-gbps",
                                     "10",   "--launch-us",      "5"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  }

  // `tiermoe init` into dir/name; fails the test on a non-zero exit.
  fs::path init(const std::string& name, std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"init", "--preset", "tiny", "--out", path(name).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << r.err;
    return path(name);
  }
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

// How often `needle` occurs in `haystack` (overlaps counted).
inline int count_of(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

inline std::vector<std::string> argv_of(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {TIERMOE_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

inline std::vector<char*> pointers(std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (std::string& a : argv) out.push_back(a.data());
  out.push_back(nullptr);
  return out;
}

// The raw wait status of `pid`, once it has ended.
inline int wait_status(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// Its exit code, -1 when a signal ended it.
inline int wait_exit(pid_t pid) {
  const int status = wait_status(pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Starts `tiermoe <args>` in the background, stdout and stderr into `log`.
inline pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> argv_s = argv_of(args);
  std::vector<char*> argv = pointers(argv_s);
  const std::string log_path = log.string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) ::_exit(127);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// Waits (up to two minutes) until `log` holds `text`; false on a timeout.
inline bool wait_for_text(const fs::path& log, const std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!contains(slurp(log), text)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace tiermoe
