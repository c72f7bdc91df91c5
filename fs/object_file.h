// An object file of the store, read in place: chunk decodes look at its
// bytes through a read-only shared mapping instead of copying them out of
// the page cache with pread (that copy was the largest single cost of a
// cold lossless read). Pages are faulted in with MADV_POPULATE_READ, which
// reports a range that cannot be read (an I/O error, a file cut short by
// someone else) as an error instead of SIGBUS; the reader then falls back
// to pread, which names the problem. A file cut short while a chunk of it
// is being decoded can still raise SIGBUS: objects are read-only, written
// once and only removed whole (the mapping keeps a removed file alive), so
// only an outside writer can do that.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "codec/common/io.h"

namespace ckptfs::fs {

// Thread safety: all methods may be called concurrently.
class ObjectFile final : public RandomAccessFile {
 public:
  // Opens `path` (O_NOFOLLOW) and maps it; a file that cannot be mapped is
  // read with pread alone. Errors carry the errno (ELOOP: a symbolic link).
  static Result<std::unique_ptr<ObjectFile>> Open(const std::string& path);
  ~ObjectFile() override;
  ObjectFile(const ObjectFile&) = delete;
  ObjectFile& operator=(const ObjectFile&) = delete;

  uint64_t Size() const override { return file_->Size(); }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const override;
  // The mapped bytes, their pages faulted in; empty without a mapping or
  // when the pages cannot be read.
  ByteSpan View(uint64_t offset, uint64_t length) const override;
  // Unmaps the view's pages from the process (they stay in the page
  // cache): mapped file pages count in the daemon's resident memory, which
  // mem= bounds.
  void EndView(ByteSpan view) const override;

 private:
  ObjectFile(std::unique_ptr<PosixFile> file, void* map) : file_(std::move(file)), map_(map) {}
  std::unique_ptr<PosixFile> file_;  // ReadAt, and the descriptor the mapping is of
  void* map_;                        // nullptr: no mapping
  // Cleared when the kernel lacks MADV_POPULATE_READ: pread from then on.
  mutable std::atomic<bool> populate_works_{true};
};

}  // namespace ckptfs::fs
