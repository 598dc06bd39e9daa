#include "run_paths.h"

#include <sys/stat.h>

#include <filesystem>
#include <regex>

#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/train/checkpoint.h"

namespace tiermoe::cli {

namespace {

namespace fs = std::filesystem;
using detail::str_of;

// The checkpoint directory `real` lies in, or "" when none: the nearest
// ancestor holding a trainer_state.json, or a run's checkpoint-N/, final/ or
// adapter/ (which need not exist yet).
std::string enclosing_checkpoint(const fs::path& real, const std::vector<std::string>& run_dirs) {
  static const std::regex run_entry(R"(checkpoint-\d+|final|adapter)");
  std::error_code ec;
  for (fs::path dir = real.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / kTrainerStateFile, ec)) return dir.string();
    for (const std::string& run : run_dirs) {
      if (dir.parent_path() == run && std::regex_match(dir.filename().string(), run_entry)) {
        return dir.string();
      }
    }
    if (dir == dir.root_path()) break;
  }
  return {};
}

}  // namespace

RunPaths::Entry RunPaths::entry(const std::string& path, const std::string& flag) {
  Entry e{.path = path, .real = real_path(path), .flag = flag};
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    e.exists = true;
    e.dev = st.st_dev;
    e.ino = st.st_ino;
  }
  return e;
}

void RunPaths::input_file(const std::string& path, const std::string& flag) {
  if (!path.empty()) inputs_.push_back(entry(path, flag));
}

void RunPaths::input_dir(const std::string& dir, const std::string& flag) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  for (const auto& file : fs::directory_iterator(dir, ec)) {
    if (file.is_regular_file(ec)) inputs_.push_back(entry(file.path().string(), flag));
  }
}

void RunPaths::run_dir(const std::string& dir) {
  if (!dir.empty()) run_dirs_.push_back(real_path(dir));
}

void RunPaths::output(const std::string& path, const std::string& flag) {
  if (!path.empty()) outputs_.push_back(entry(path, flag));
}

void RunPaths::check() const {
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const Entry& out = outputs_[i];
    std::error_code ec;
    TIERMOE_CHECK(!fs::is_directory(out.path, ec), out.flag + " names a directory", out.path,
                  "give a file path, e.g. " + (fs::path(out.path) / "run.out").string());
    for (const Entry& in : inputs_) {
      const bool same = out.real == in.real ||
                        (out.exists && in.exists && out.dev == in.dev && out.ino == in.ino);
      TIERMOE_CHECK(
          !same,
          str_of(out.flag, " would overwrite ", in.path, ", which the run reads (", in.flag, ")"),
          out.path, "write " + out.flag + " to a file of its own");
    }
    for (size_t j = 0; j < i; ++j) {
      const Entry& other = outputs_[j];
      const bool same = out.real == other.real || (out.exists && other.exists &&
                                                   out.dev == other.dev && out.ino == other.ino);
      TIERMOE_CHECK(!same, str_of(out.flag, " and ", other.flag, " name the same file"), out.path,
                    "give each output a file of its own");
    }
    const std::string checkpoint = enclosing_checkpoint(out.real, run_dirs_);
    TIERMOE_CHECK(checkpoint.empty(),
                  str_of(out.flag, " lies inside the checkpoint directory ", checkpoint,
                         ", which checkpoint saves and --keep-last replace whole"),
                  out.path, "write it beside the checkpoints, not into one");
    const fs::path parent = fs::path(out.real).parent_path();
    TIERMOE_CHECK(fs::is_directory(parent, ec), "the directory of " + out.flag + " does not exist",
                  parent.string(), "create it, or pass another " + out.flag);
    // A new file beside the output, removed again: what writing it will take.
    try {
      AtomicFile probe(out.path);
    } catch (const Error& e) {
      throw Error(str_of(out.flag, " cannot be written: ", e.message()), out.path,
                  "choose a writable location (--out DIR keeps a run's files together)");
    }
  }
}

}  // namespace tiermoe::cli
