#include "tiermoe/train/out_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tiermoe/core/error.h"
#include "tiermoe/train/checkpoint.h"

namespace tiermoe {

namespace fs = std::filesystem;
using detail::str_of;

namespace {

// The pid /proc/locks shows for a flock on inode `ino`; 0 when unknown.
// Lines read "1: FLOCK  ADVISORY  WRITE 4242 00:2f:1234 0 EOF". Only the
// inode is matched: the device numbers an overlay file system reports to
// stat() need not be the ones the lock table shows.
int64_t flock_holder(ino_t ino) {
  std::ifstream in("/proc/locks");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, kind, mode, access, dev_ino;
    int64_t pid = 0;
    if (!(fields >> id >> kind >> mode >> access >> pid >> dev_ino) || kind != "FLOCK") continue;
    const size_t colon = dev_ino.rfind(':');
    if (colon != std::string::npos && dev_ino.substr(colon + 1) == std::to_string(ino)) return pid;
  }
  return 0;
}

// Removes (or renames) a path, as an Error naming it when that fails.
void remove_path(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  TIERMOE_CHECK(!ec, "cannot remove it: " + ec.message(), p.string(),
                "check the --out directory's permissions");
}

void rename_path(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  TIERMOE_CHECK(!ec, str_of("cannot rename it to ", to.string(), ": ", ec.message()), from.string(),
                "check the --out directory's permissions");
}

uint64_t bytes_under(const fs::path& p) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  }
  return n;
}

}  // namespace

namespace {

// flock(LOCK_EX) on the file at `lock`, created if missing; throws `busy`
// (its holder's pid added) when another process holds it. The file is
// removed by the run that ends holding it, so the lock taken may be on a
// file another run has just unlinked: then the path names a new file (or
// none), and the lock is taken again on that.
int take_lock(const std::string& lock, const std::string& busy, const std::string& where,
              const std::string& hint) {
  for (;;) {
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TIERMOE_CHECK(fd >= 0, str_of("cannot open the lock file: ", std::strerror(errno)), lock,
                  "the directory must be writable");
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      struct stat st {};
      const int64_t pid = ::fstat(fd, &st) == 0 ? flock_holder(st.st_ino) : 0;
      ::close(fd);
      TIERMOE_CHECK(err == EWOULDBLOCK, str_of("cannot take the lock: ", std::strerror(err)), lock,
                    "write on a local file system that supports flock");
      throw Error(
          str_of("another tiermoe run", pid > 0 ? str_of(" (pid ", pid, ")") : "", " ", busy),
          where, hint);
    }
    struct stat held = {};
    struct stat named = {};
    if (::fstat(fd, &held) == 0 && ::stat(lock.c_str(), &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      return fd;
    }
    ::close(fd);
  }
}

}  // namespace

OutDirLock::OutDirLock(const std::string& dir) : path_((fs::path(dir) / kOutDirLockFile).string()) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TIERMOE_CHECK(!ec, "cannot create the output directory: " + ec.message(), dir,
                "check the path and its permissions");
  fd_ = take_lock(path_, "is writing to this output directory", dir,
                  "wait until it has finished, or pass another --out (two runs would overwrite "
                  "each other's checkpoints)");
}

OutDirLock::~OutDirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before the unlock: a waiting run then finds the path gone
  ::close(fd_);
}

OutputFileLock::OutputFileLock(const std::string& file, const std::string& flag) {
  const fs::path p(file);
  path_ = (p.parent_path() / ("." + p.filename().string() + ".tiermoe.lock")).string();
  fd_ = take_lock(path_, "is writing " + flag + " " + file, file,
                  "wait until it has finished, or give this run another " + flag +
                      " (two runs would mix their lines)");
}

OutputFileLock::~OutputFileLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
}

OutDirCleanup clean_out_dir(const std::string& dir) {
  static const std::regex leftover(R"(\.(checkpoint-\d{1,18}|final|adapter)\.(tmp|old|del)-\d+)");
  OutDirCleanup out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    std::smatch m;
    if (!std::regex_match(name, m, leftover)) continue;
    const fs::path p = fs::path(dir) / name;
    const fs::path target = fs::path(dir) / m[1].str();
    if (m[2] == "old" && !fs::exists(target)) {
      rename_path(p, target);
      out.restored.push_back(target.string());
      continue;
    }
    out.removed_bytes += bytes_under(p);
    remove_path(p);
    out.removed.push_back(p.string());
  }
  return out;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last,
                                           const std::string& newest) {
  TIERMOE_CHECK(keep_last >= 0, str_of("--keep-last ", keep_last, " must be >= 0"), "--keep-last",
                "0 keeps every checkpoint");
  std::vector<std::string> removed;
  if (keep_last == 0) return removed;
  std::vector<std::pair<int64_t, std::string>> others = list_checkpoint_dirs(dir);
  int64_t newest_step = -1;
  for (const auto& [step, path] : others) {
    if (fs::equivalent(path, newest)) newest_step = step;
  }
  // Above the one just written lie an earlier run's later checkpoints (this
  // run resumed below them): not this run's to delete.
  std::erase_if(others, [&](const auto& c) { return c.first >= newest_step; });
  const int64_t drop = int64_t(others.size()) - (keep_last - 1);
  for (int64_t i = 0; i < drop; ++i) {
    const fs::path p = others[size_t(i)].second;
    const fs::path aside =
        p.parent_path() / str_of(".", p.filename().string(), ".del-", ::getpid());
    rename_path(p, aside);
    remove_path(aside);
    removed.push_back(p.string());
  }
  return removed;
}

}  // namespace tiermoe
