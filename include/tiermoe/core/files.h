#pragma once
// Opening files a user names (checkpoints, shards, data, profiles) without
// hanging: open(2) on a FIFO blocks until a writer appears, and reading a
// character device never ends, so anything that is not a regular file is an
// Error naming the path and what it is instead.
#include <cstddef>
#include <string>
#include <string_view>

namespace tiermoe {

// Throws unless `path` (symlinks followed) is a regular file: "no such
// file", "is a directory", "is a FIFO", ... with `what` (e.g. "token file")
// and `hint`. For readers that open the path themselves afterwards.
void require_regular_file(const std::string& path, const std::string& what,
                          const std::string& hint);

// open(path, O_RDONLY) that cannot block: the descriptor of a regular file,
// or the Error require_regular_file throws (nothing left open). The caller
// closes the descriptor.
int open_regular_file(const std::string& path, const std::string& what, const std::string& hint);

// Writes a file beside `path` (PATH.tmp-<pid>-<n>, created exclusively, so no
// file of the user's is ever overwritten) and renames it over `path` only on
// commit(), after fsync, then fsyncs the directory: `path` holds the old or
// the complete new contents, and a file another process has mapped is
// replaced, never truncated under it. The temporary is removed when the
// writer is destroyed without commit() (an exception on the way). A
// directory at `path` is an Error up front; a character device (/dev/null)
// is written in place, since renaming over it would replace the device.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, tmp_path_;  // tmp_path_ empty: written in place
  int fd_ = -1;
};

// Writes a small file whole or not at all, through an AtomicFile. For
// config.json, index and profile files, token files, reports; checkpoints
// have their own directory swap.
void write_file_atomic(const std::string& path, std::string_view bytes);

// A new, empty file put in place of `path` at once, open for appending: for
// outputs that grow as a run goes (--metrics). The old file is replaced by a
// rename, not truncated, as with AtomicFile. The caller closes the
// descriptor.
int create_replacing(const std::string& path);

// Writes all `bytes` to `fd` (retrying short writes and EINTR); an Error
// naming `path` when the disk is full or the write fails.
void write_all(int fd, const void* data, size_t bytes, const std::string& path);

// `path` absolute, with links resolved as far as it exists and "." and ".."
// gone: how two names of one file compare equal.
std::string real_path(const std::string& path);

}  // namespace tiermoe
