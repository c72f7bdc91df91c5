// An output file that takes the place of `path` only once it is complete.
//
// Why: the commands that write a user's file (`ckptfs decode`, `restore`,
// `encode`) used to open it with O_TRUNC: a decode that failed halfway (a
// checksum mismatch, a missing base, a full disk) had already destroyed the
// file it was replacing. The bytes go to a new file beside `path` instead,
// and Commit puts it in place. Also faster on ext4: truncating a large
// file that still has dirty pages, and closing a file that was truncated,
// both start its writeback in the caller (the `auto_da_alloc` heuristic;
// 0.1-0.2 s of a 201 MB decode here).
//
// Commit unlinks an existing `path` and then renames the new file to it,
// rather than renaming over it: ext4 also starts the writeback of a file
// renamed over another (0.17 s for 200 MB), which the commands do not
// need (they do not fsync, like cp or zstd -d). Between the unlink and the
// rename `path` is briefly absent; the new file is complete by then.
//
// Where `path` exists and is not a regular file (a device such as
// /dev/null, a FIFO, a symbolic link) the bytes are written to it
// directly, as before, and nothing is created, renamed or removed.
#pragma once

#include <string>

#include "codec/common/bytes.h"
#include "codec/common/status.h"

namespace ckptfs {

class ReplacementFile {
 public:
  // Creates the new file (mode 0644 before the umask) in `path`'s
  // directory, named `.<name>.ckptfs-XXXXXX`.
  static Result<ReplacementFile> Create(const std::string& path);
  ReplacementFile(ReplacementFile&& other) noexcept;
  ReplacementFile& operator=(ReplacementFile&& other) = delete;
  // Removes the new file unless Commit succeeded: no partial output is
  // left behind, and `path` keeps what it held (written directly: what
  // was written stays).
  ~ReplacementFile();

  Status Append(ByteSpan data);
  // Closes the new file and puts it at `path`.
  Status Commit();
  const std::string& path() const { return path_; }

 private:
  ReplacementFile(int fd, std::string path, std::string temp_path);
  int fd_ = -1;
  std::string path_;
  std::string temp_path_;  // empty: writing to `path` directly
  bool committed_ = false;
};

}  // namespace ckptfs
