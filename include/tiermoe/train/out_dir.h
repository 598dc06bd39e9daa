#pragma once
// The --out directory of a training run: one run at a time, nothing left
// behind by runs that were killed, and as many checkpoints as asked for.
//
// The lock. A run holds flock(LOCK_EX) on DIR/.tiermoe.lock from its start
// to its end; a second run on the same directory fails at once with an Error
// naming the holder's pid (read from /proc/locks when the kernel shows it).
// The kernel drops the lock when the holder's process ends however it ends
// (exit, crash, SIGKILL), so a lock file left by a killed run blocks nobody:
// the next run takes the lock on it. A run that ends normally removes the
// file while it still holds the lock.
//
// Leftovers. A directory is written as .NAME.tmp-PID beside NAME and
// swapped into place (checkpoint.h); a replaced NAME may pass through
// .NAME.old-PID, and a pruned checkpoint through .NAME.del-PID. A run killed
// on the way leaves these behind. Once it holds the lock a run removes every
// .tmp and .del directory of checkpoint-<N>, final and adapter (no other run
// can be writing them), and puts an .old one back under NAME when NAME is
// missing (the kill fell between the two renames of a swap), or removes it.
//
// Under expert parallelism only rank 0 locks, cleans and prunes; the other
// ranks write only into the temporary directory rank 0 names.
#include <cstdint>
#include <string>
#include <vector>

namespace tiermoe {

inline constexpr const char* kOutDirLockFile = ".tiermoe.lock";

class OutDirLock {
 public:
  // Creates `dir` when missing and takes its lock, or throws an Error naming
  // the directory and the process holding it.
  explicit OutDirLock(const std::string& dir);
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

  const std::string& path() const { return path_; }  // the lock file

 private:
  std::string path_;
  int fd_ = -1;
};

// The same lock on a file a run writes outside its --out (--metrics): held
// on .NAME.tiermoe.lock beside it, so a second run writing the same file
// fails at once naming `flag` instead of mixing or losing its lines.
class OutputFileLock {
 public:
  OutputFileLock(const std::string& file, const std::string& flag);
  ~OutputFileLock();
  OutputFileLock(const OutputFileLock&) = delete;
  OutputFileLock& operator=(const OutputFileLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// What clean_out_dir did, one line per directory, for the run's log.
struct OutDirCleanup {
  std::vector<std::string> removed;   // temporaries of killed runs
  std::vector<std::string> restored;  // NAME put back from .NAME.old-PID
  uint64_t removed_bytes = 0;
};

// Removes or restores what killed runs left in `dir` (see above). Call it
// holding the directory's lock.
OutDirCleanup clean_out_dir(const std::string& dir);

// Keeps `keep_last` checkpoint-<N> directories in `dir` at or below
// `newest` (the one just written): it and the keep_last - 1 with the highest
// steps below it; removes the others (each renamed out of the way first, so
// a kill never leaves a half-removed checkpoint under a real name).
// Checkpoints above `newest` (an earlier run's, past the step this one
// resumed from) are never removed. keep_last 0 keeps all. Returns the
// directories removed, for the log.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last,
                                           const std::string& newest);

}  // namespace tiermoe
