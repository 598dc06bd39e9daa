#pragma once
// Opening files a user names (checkpoints, shards, data, profiles) without
// hanging: open(2) on a FIFO blocks until a writer appears, and reading a
// character device never ends, so anything that is not a regular file is an
// Error naming the path and what it is instead.
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

// Writes a small file whole or not at all: `bytes` go to PATH.tmp, which is
// renamed over `path` once written. A failure (a full disk, no permission)
// throws an Error naming the file and removes PATH.tmp, so `path` keeps what
// it held and nothing is left beside it. For config.json, index and profile
// files, token files; checkpoints have their own directory swap.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace tiermoe
