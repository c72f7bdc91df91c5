// An output file that takes the place of `path` only once it is complete.
//
// Why: the commands that write a user's file (`ckptfs decode`, `restore`,
// `encode`) used to open it with O_TRUNC: a decode that failed halfway (a
// checksum mismatch, a missing base, a full disk) had already destroyed the
// file it was replacing. The bytes go to a new file beside `path` instead,
// and Commit puts it in place atomically. Also faster on ext4: truncating a
// large file that still has dirty pages, and closing a file that was
// truncated, both start its writeback in the caller (the `auto_da_alloc`
// heuristic; 0.1-0.2 s of a 201 MB decode).
//
// Commit swaps the two names (renameat2 RENAME_EXCHANGE) and then removes
// the old file under the new one's temporary name: readers see the old
// file or the new one, never none. Not a rename over the old file: ext4
// starts the writeback of a file renamed over another (0.17 s for 200 MB),
// which the commands do not need (they do not fsync, like cp or zstd -d);
// where the filesystem cannot exchange, it is that rename.
//
// The new file keeps what the old one's inode carried that the commands
// can carry: its mode and, where allowed, its owner and group (extended
// attributes and ACLs are not copied). Where replacing would change more
// than the bytes, the bytes are written into `path` directly, as O_TRUNC
// did, and a failure leaves what was written:
//  - `path` is not a regular file (a device such as /dev/null, a FIFO);
//  - `path` is a regular file with other hard links (they must see it);
//  - the old owner cannot be given to the new file;
//  - no file can be made beside it (a directory the user cannot write to,
//    a name too long for the temporary suffix).
// A symbolic link is followed: the file it points to is replaced, and the
// link stays (a dangling link is written through, making its target).
#pragma once

#include <string>

#include "codec/common/bytes.h"
#include "codec/common/status.h"

namespace ckptfs {

class ReplacementFile {
 public:
  // Creates the new file in the directory of `path` (or of the file a link
  // at `path` points to), named `.<name>.ckptfs-XXXXXX`, with the old
  // file's mode, or 0644 less the umask for a new one.
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
  // Whether the bytes go to a new file (false: into `path` directly).
  bool replaces() const { return !temp_path_.empty(); }

 private:
  ReplacementFile(int fd, std::string path, std::string target, std::string temp_path);
  int fd_ = -1;
  std::string path_;       // as the caller named it (for messages)
  std::string target_;     // the file replaced: `path`, or where its link points
  std::string temp_path_;  // empty: writing to `path` directly
  bool committed_ = false;
};

}  // namespace ckptfs
