#pragma once
// What a command reads and what it writes, checked against each other before
// any work, so that no path a user types can make one output destroy an input
// or another output:
//   - an output may not be one of the inputs (compared by real path and by
//     inode, so symlinks and hard links count), nor a file in an input
//     directory (a model's shards, an adapter, a checkpoint);
//   - it may not lie inside a checkpoint directory (any directory holding a
//     trainer_state.json, and the checkpoint-N/, final/ and adapter/
//     directories a run writes in --out): saves and --keep-last replace
//     those whole;
//   - two flags may not name the same output, nor an output a directory;
//   - its directory must take a new file, which is probed, so that a
//     read-only location fails before step 1 rather than after the last.
#include <sys/types.h>

#include <string>
#include <vector>

namespace tiermoe::cli {

class RunPaths {
 public:
  // A file the command reads; `flag` names it in errors ("--data").
  void input_file(const std::string& path, const std::string& flag);
  // A directory whose files the command reads (a model, an adapter).
  void input_dir(const std::string& dir, const std::string& flag);
  // The --out of a training run: the checkpoint-N/, final/ and adapter/
  // directories in it are replaced whole as the run goes.
  void run_dir(const std::string& dir);
  // A file the command writes, named by `flag`.
  void output(const std::string& path, const std::string& flag);

  // Throws an Error naming the flag and the path at the first conflict.
  void check() const;

 private:
  struct Entry {
    std::string path, real, flag;
    dev_t dev = 0;
    ino_t ino = 0;
    bool exists = false;
  };
  static Entry entry(const std::string& path, const std::string& flag);

  std::vector<Entry> inputs_, outputs_;
  std::vector<std::string> run_dirs_;  // real paths
};

}  // namespace tiermoe::cli
