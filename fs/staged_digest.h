// The digests of a staging file's bytes, computed as the writes arrive.
// The content index (fs/content_index.h) keys a version by the XXH3-128
// and XXH3-64 of its whole file; hashing them at commit time re-read the
// staged file, on the serial head of every commit (about 0.2 s per 600 MB
// on a two-core machine, from the page cache). A checkpoint is written
// front to back, and each write's bytes are hot in the CPU's cache when
// the FUSE handler has just copied them: hashed there, the commit finds
// the digests ready.
//
// A wrong digest would make the index name another file's blob, so the
// digests are only ever trusted for bytes written strictly in order from
// an empty file, each exactly once: any other change (a write anywhere but
// at the hashed end, a truncate to a non-zero size, fallocate, a copy of
// earlier content into the file, a write that failed part way) makes them
// unknown until the file is truncated to zero again, and the commit then
// hashes the file as before. Writes race with truncates and with each
// other only through this class: a write takes a ticket before its bytes
// reach the file and appends them only if no Reset or Invalidate came
// between, so a truncate that lands between a write's pwrite and its
// Append can never have its bytes counted.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>

#include "codec/common/bytes.h"
#include "codec/common/hash.h"

namespace ckptfs::fs {

// The two hashes of a file's bytes the content index uses.
struct FileDigests {
  ObjectId id;
  uint64_t checksum = 0;
};

// One pass over `file` for both hashes.
FileDigests DigestFile(ByteSpan file);

// Thread safety: every member may be called concurrently.
class StagedDigest {
 public:
  // A write's claim, taken before its bytes reach the file.
  struct Ticket {
    uint64_t generation = 0;
  };

  // Starts unknown (a staging file found by recovery, or one whose
  // content came from elsewhere) until Reset. With `enabled` false the
  // digests are never known, and every call returns at once (a mount that
  // never reads them does not pay for the hashing).
  explicit StagedDigest(bool enabled = true);
  StagedDigest(const StagedDigest&) = delete;
  StagedDigest& operator=(const StagedDigest&) = delete;

  // The file is empty now: the digests follow its writes from here.
  void Reset();
  // The file changed in a way the digests cannot follow.
  void Invalidate();
  // The file was truncated to `size`: zero is Reset, the hashed length
  // keeps the digests (a writer setting the size it wrote), anything else
  // is Invalidate. Writes in flight lose their tickets either way.
  void Truncated(uint64_t size);
  // Before a write's pwrite.
  Ticket BeginWrite() const;
  // After `data` was written whole at `offset`: hashed when it extends the
  // hashed bytes exactly and nothing reset or invalidated the digests since
  // `ticket`; otherwise the digests become unknown.
  void Append(const Ticket& ticket, uint64_t offset, ByteSpan data);
  // The digests of the file when it is `size` bytes long and they cover
  // exactly those bytes; nullopt otherwise.
  std::optional<FileDigests> For(uint64_t size) const;

 private:
  const bool enabled_;
  mutable std::mutex mu_;
  uint64_t generation_ = 0;  // bumped by Reset and Invalidate
  bool known_ = false;
  uint64_t length_ = 0;  // bytes hashed
  std::optional<ObjectIdStream> id_;  // set while known_
  std::optional<Checksum64Stream> checksum_;
};

}  // namespace ckptfs::fs
