#include "tiermoe/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

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

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      TIERMOE_CHECK(out.good(), "cannot open for writing", tmp,
                    "check the directory exists and is writable");
      out.write(bytes.data(), std::streamsize(bytes.size()));
      out.flush();
      TIERMOE_CHECK(out.good(), "write failed", tmp, "check free disk space");
    }
    std::filesystem::rename(tmp, path, ec);
    TIERMOE_CHECK(!ec, "cannot rename " + tmp + ": " + ec.message(), path, "check permissions");
  } catch (...) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

}  // namespace tiermoe
