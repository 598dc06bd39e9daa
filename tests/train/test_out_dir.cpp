// The --out directory: its lock (a second holder refused with the first's
// pid, a killed holder and a stale lock file blocking nobody), the clean-up
// of what killed runs left, --keep-last pruning, and a replaced directory
// that is whole at every instant of its swap.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "common/test_dir.h"
#include "tiermoe/core/error.h"
#include "tiermoe/train/checkpoint.h"
#include "tiermoe/train/out_dir.h"

namespace tiermoe {
namespace {

namespace fs = std::filesystem;

class OutDir : public testing::DirTest {
 protected:
  OutDir() : DirTest("tiermoe_test_out_dir_") {}

  void write(const fs::path& rel, const std::string& text) const {
    fs::create_directories((dir_ / rel).parent_path());
    std::ofstream(dir_ / rel) << text;
  }
  std::string read(const fs::path& rel) const {
    std::ifstream in(dir_ / rel);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  std::set<std::string> entries() const { return testing::dir_entries(dir_); }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(OutDir, ASecondLockIsRefusedNamingTheHolder) {
  const fs::path out = dir_ / "run";
  {
    OutDirLock first(out.string());
    EXPECT_TRUE(fs::exists(out / kOutDirLockFile));
    const std::string err = error_of([&] { OutDirLock second(out.string()); });
    EXPECT_NE(err.find("another tiermoe run (pid " + std::to_string(::getpid()) + ")"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(out.string()), std::string::npos) << err;
  }
  EXPECT_FALSE(fs::exists(out / kOutDirLockFile)) << "a run that ends removes its lock file";
  OutDirLock again(out.string());  // and the next one takes it
}

TEST_F(OutDir, AKilledHolderAndItsStaleLockFileBlockNobody) {
  const fs::path out = dir_ / "run";
  fs::create_directories(out);
  const std::string lock_file = (out / kOutDirLockFile).string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Plain system calls only between fork and _exit.
    const int fd = ::open(lock_file.c_str(), O_RDWR | O_CREAT, 0644);
    const char ok = (fd >= 0 && ::flock(fd, LOCK_EX) == 0) ? '1' : '0';
    if (::write(ready[1], &ok, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  char ok = 0;
  ASSERT_EQ(::read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, '1');
  const std::string err = error_of([&] { OutDirLock mine(out.string()); });
  EXPECT_NE(err.find("(pid " + std::to_string(child) + ")"), std::string::npos) << err;

  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_TRUE(fs::exists(lock_file)) << "the killed holder left its lock file";
  OutDirLock mine(out.string());  // the kernel released the lock with the process
}

TEST_F(OutDir, CleanUpRemovesTemporariesAndPutsAnAsideCopyBack) {
  write(".checkpoint-3.tmp-4242/model.safetensors", std::string(1000, 'x'));
  write(".checkpoint-2.del-17/optimizer.safetensors", "half removed");
  write(".final.old-99/config.json", "the old final");         // no final/: put back
  write(".adapter.old-98/adapter_config.json", "superseded");  // adapter/ exists: removed
  write("adapter/adapter_config.json", "current");
  write(".final.tmp-99/config.json", "the new final, not yet swapped in");
  write("checkpoint-4/trainer_state.json", "kept");
  write(".notes/readme", "not ours");
  write(".checkpoint-5.tmp-x/a", "not a name we write");

  const OutDirCleanup c = clean_out_dir(dir_.string());
  EXPECT_EQ(c.removed.size(), 4u);
  EXPECT_EQ(c.restored, std::vector<std::string>{(dir_ / "final").string()});
  EXPECT_GE(c.removed_bytes, 1000u);
  EXPECT_EQ(entries(), (std::set<std::string>{"adapter", "checkpoint-4", "final", ".notes",
                                              ".checkpoint-5.tmp-x"}));
  EXPECT_EQ(read("final/config.json"), "the old final");
  EXPECT_EQ(read("adapter/adapter_config.json"), "current");
  EXPECT_EQ(read("checkpoint-4/trainer_state.json"), "kept");
}

TEST_F(OutDir, KeepLastKeepsTheNewestAndTheOneJustWritten) {
  for (int step : {2, 4, 6, 8, 10}) write("checkpoint-" + std::to_string(step) + "/a", "x");
  write("final/a", "x");
  EXPECT_TRUE(prune_checkpoints(dir_.string(), 0, (dir_ / "checkpoint-10").string()).empty());
  EXPECT_EQ(entries().size(), 6u) << "0 keeps every checkpoint";

  const auto removed = prune_checkpoints(dir_.string(), 3, (dir_ / "checkpoint-10").string());
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_EQ(entries(),
            (std::set<std::string>{"checkpoint-6", "checkpoint-8", "checkpoint-10", "final"}));
  // A run resumed from checkpoint-6 writes checkpoint-7 below later ones:
  // the one just written is kept, and so are the earlier run's 8 and 10.
  write("checkpoint-7/a", "x");
  EXPECT_EQ(prune_checkpoints(dir_.string(), 1, (dir_ / "checkpoint-7").string()),
            std::vector<std::string>{(dir_ / "checkpoint-6").string()});
  EXPECT_EQ(entries(),
            (std::set<std::string>{"checkpoint-7", "checkpoint-8", "checkpoint-10", "final"}));

  EXPECT_NE(error_of([&] { prune_checkpoints(dir_.string(), -1, ""); }).find("--keep-last"),
            std::string::npos);
}

// Replacing a directory: a reader looking at it all the while never finds
// it missing or incomplete.
TEST_F(OutDir, AReplacedDirectoryIsWholeAtEveryInstant) {
  const fs::path target = dir_ / "final";
  auto write_version = [&](int v) {
    write_dir_atomically(target.string(), [v](const std::string& tmp) {
      std::ofstream(fs::path(tmp) / "config.json") << v;
      std::ofstream(fs::path(tmp) / "model.safetensors") << v;
    });
  };
  write_version(0);
  std::atomic<bool> done{false};
  std::atomic<int64_t> looks{0}, misses{0};
  std::thread reader([&] {
    while (!done) {
      std::error_code ec;
      const bool whole =
          fs::exists(target / "config.json", ec) && fs::exists(target / "model.safetensors", ec);
      misses += !whole;
      ++looks;
    }
  });
  for (int v = 1; v <= 150; ++v) write_version(v);
  done = true;
  reader.join();
  EXPECT_EQ(misses.load(), 0) << "of " << looks.load() << " looks";
  EXPECT_GT(looks.load(), 150);
  EXPECT_EQ(read("final/config.json"), "150");
  EXPECT_EQ(entries(), std::set<std::string>{"final"}) << "no temporary is left";
}

}  // namespace
}  // namespace tiermoe
