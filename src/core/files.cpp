#include "tiermoe/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tiermoe/core/error.h"

namespace tiermoe {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void not_regular(const std::string& path, const std::string& what, mode_t mode,
                              const std::string& hint) {
  throw Error(what + " is " + kind_of(mode) + ", not a regular file", path, hint);
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what,
                          const std::string& hint) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw Error("cannot open " + what + ": " + std::strerror(errno), path, hint);
  }
  if (!S_ISREG(st.st_mode)) not_regular(path, what, st.st_mode, hint);
}

int open_regular_file(const std::string& path, const std::string& what, const std::string& hint) {
  // O_NONBLOCK makes open return at once on a FIFO; fstat then tells what
  // was opened. Regular files ignore the flag, which is cleared anyway.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error("cannot open " + what + ": " + std::strerror(errno), path, hint);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    not_regular(path, what, mode, hint);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

namespace {

std::string errno_text() { return std::strerror(errno); }

// What stands at `path` now: 0 when nothing does.
mode_t mode_at(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_mode : 0;
}

// Opens the file an output's bytes go to: a character device in place
// (tmp empty), else a new temporary beside `path`, named so that no
// concurrent writer in this or another process can pick it.
int open_output(const std::string& path, std::string& tmp) {
  const mode_t mode = mode_at(path);
  tmp.clear();
  if (S_ISCHR(mode)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    TIERMOE_CHECK(fd >= 0, "cannot open for writing: " + errno_text(), path,
                  "check the device's permissions");
    return fd;
  }
  if (mode != 0 && !S_ISREG(mode)) {
    throw Error(std::string("the output is ") + kind_of(mode) + ", not a file", path,
                "give the path of a file to write (a directory's is DIR/NAME)");
  }
  static std::atomic<uint64_t> counter{0};
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  TIERMOE_CHECK(fd >= 0, "cannot create " + tmp + ": " + errno_text(), path,
                "check that the directory exists and is writable");
  return fd;
}

// Renames the temporary over `path` (removing it when that fails) and makes
// the rename durable.
void replace_with(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw Error("cannot replace it: " + why, path, "check the directory permissions");
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  fd_ = open_output(path_, tmp_path_);
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  if (!tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  TIERMOE_ASSERT(fd_ >= 0, "write after commit");
  write_all(fd_, data, bytes, path_);
}

void AtomicFile::commit() {
  TIERMOE_ASSERT(fd_ >= 0, "commit twice");
  const int fd = fd_;
  fd_ = -1;
  if (tmp_path_.empty()) {
    ::close(fd);
    return;
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string why = errno_text();
  if (!synced || ::close(fd) != 0) {
    ::unlink(tmp_path_.c_str());
    throw Error("cannot write " + tmp_path_ + ": " + (synced ? errno_text() : why), path_,
                "check free disk space");
  }
  replace_with(tmp_path_, path_);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

int create_replacing(const std::string& path) {
  std::string tmp;
  const int fd = open_output(path, tmp);
  if (!tmp.empty()) {
    try {
      replace_with(tmp, path);
    } catch (...) {
      ::close(fd);
      throw;
    }
  }
  return fd;
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    TIERMOE_CHECK(n > 0, "write failed: " + errno_text(), path, "check free disk space");
    p += n;
    bytes -= size_t(n);
  }
}

std::string real_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p =
      std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  return ec ? std::filesystem::absolute(path).lexically_normal().string() : p.string();
}

}  // namespace tiermoe
