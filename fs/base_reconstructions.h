// Reconstructions of the checkpoints this daemon committed last, kept on
// this machine's disk for the next version's encode.
//
// A delta frame is encoded against its base's reconstruction. The chunk
// cache keeps that of a file up to half its size (commit_pipeline.cc); a
// larger checkpoint's next version decoded its whole base chain from the
// store again (a third of a delta frame's encode, and on a shared store
// every byte of the chain crossed the network). Such reconstructions are
// written to unnamed files (O_TMPFILE) in the staging root (the node's
// disk), and the next encode reads its base from there.
//
// Nothing of this is part of the store: the files have no name, so they
// vanish with the daemon (also when it is killed), and a reconstruction is
// used only after its size and XXH3-64 match the blob's file checksum (a
// wrong base would silently corrupt the delta frame encoded against it).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "codec/common/hash.h"
#include "codec/container/blob.h"

namespace ckptfs::fs {

// What a daemon keeps at most: the newest version of each of a few large
// checkpoint files (each kept one replaces its base's), within the free-space
// rule of Write.
inline constexpr uint64_t kKeptReconstructionBytes = uint64_t{16} << 30;

class BaseReconstructions {
 public:
  // Free space the disk must keep besides a new reconstruction: this share
  // of its size, and the reconstruction's size again (staging files of the
  // next saves live there too).
  static constexpr double kKeepFreeShare = 0.1;

  // `dir`: a directory on this machine's disk. At most `capacity_bytes`
  // are kept (the oldest go first).
  BaseReconstructions(std::string dir, uint64_t capacity_bytes);
  ~BaseReconstructions();
  BaseReconstructions(const BaseReconstructions&) = delete;
  BaseReconstructions& operator=(const BaseReconstructions&) = delete;

  // A reconstruction written to an unnamed file, not yet kept. Moves only.
  class Pending {
   public:
    Pending(int fd, uint64_t size) : fd_(fd), size_(size) {}
    Pending(Pending&& o) noexcept : fd_(std::exchange(o.fd_, -1)), size_(o.size_) {}
    Pending& operator=(Pending&& o) noexcept;
    ~Pending();
    uint64_t size() const { return size_; }

   private:
    friend class BaseReconstructions;
    int fd_;
    uint64_t size_;
  };

  // Writes `recon` to an unnamed file. nullopt (nothing kept, nothing
  // left behind) when the directory's filesystem has no unnamed files, the
  // disk would keep less free space than kKeepFreeShare of it plus the
  // reconstruction's size, it exceeds the capacity, or a write fails.
  std::optional<Pending> Write(ByteSpan recon);
  // Keeps `pending` as blob `id`'s reconstruction. `replaces`: the base the
  // blob was encoded against, whose reconstruction the next version no
  // longer needs (dropped now). Drops the oldest beyond the capacity.
  void Keep(const ObjectId& id, Pending pending, const std::optional<ObjectId>& replaces);
  // Blob `id`'s reader `inner`, or, when its reconstruction is kept and
  // matches the blob's logical size and file checksum, a reader of the
  // same blob whose ReadAt copies from the kept reconstruction (the rest is
  // inner's). A mismatch drops the kept file.
  std::shared_ptr<const BlobReader> Wrap(const ObjectId& id, std::shared_ptr<const BlobReader> inner);

  uint64_t kept_bytes() const;
  size_t kept_count() const;

  struct KeptFile;  // (the reader of a kept file holds it)

 private:
  struct Entry {
    ObjectId id;
    std::shared_ptr<const KeptFile> file;
    bool verified = false;
  };
  void DropLocked(std::list<Entry>::iterator it);

  const std::string dir_;
  const uint64_t capacity_;
  mutable std::mutex mu_;  // guards the fields below
  std::list<Entry> entries_;  // oldest first
  uint64_t bytes_ = 0;
};

}  // namespace ckptfs::fs
