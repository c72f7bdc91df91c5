// The reconstructions of the checkpoints this daemon just wrote, kept in
// unnamed files of its staging area (node-local: the staging directory, or
// the store's own staging on a local disk) so that the next version's
// delta encode, and reads on this node, find its base's bytes without
// decoding the chain again (the chunk cache holds only files up to half
// its size). The files are O_TMPFILE (or unlinked at once): they never
// appear in a directory, and their space goes back when the daemon drops
// them or dies. They are written and read around the page cache
// (direct_file.h says why). Every chunk read from here is checked
// against its blob's chunk checksum (blob_reader.cc) before it is used.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "codec/common/io.h"
#include "codec/common/status.h"
#include "codec/container/chunk_spill.h"
#include "fs/direct_file.h"

namespace ckptfs::fs {

class ReconstructionSpill final : public ChunkSpill {
 public:
  // The default bound of a spill in `dir`: a quarter of the free space of
  // its filesystem, at most kMaxDefaultBytes; 0 on tmpfs (the files would
  // be memory, outside mem=).
  static constexpr uint64_t kMaxDefaultBytes = uint64_t{16} << 30;
  static uint64_t DefaultCapacity(const std::string& dir);
  // At most this many reconstructions are kept (each holds a descriptor).
  static constexpr size_t kMaxEntries = 64;
  // A write leaves at least this share of the filesystem free (and 1 GiB),
  // for the store and the staging files: kept reconstructions leave first,
  // then the write is skipped.
  static constexpr double kFreeShare = 0.1;

  // The size of the spill's filesystem and the space available on it.
  struct Space {
    uint64_t total = 0;
    uint64_t available = 0;
  };
  // How the spill learns them (nullopt: unknown, nothing is written).
  using SpaceProbe = std::function<std::optional<Space>()>;

  // Reconstructions kept in memory, up to `memory_bytes` of them, and
  // written to unnamed files in `dir` when they leave memory (or do not
  // fit it), at most `capacity_bytes` of files (the least recently used
  // leave first). Memory first: a file is written around the page cache
  // (direct_file.h), and a reconstruction replaced by its file's next
  // version before it leaves memory is never written at all (through the
  // page cache, such a file cost the CPU of the cache's fill and never
  // reached the disk; written directly, it reached the disk and delayed
  // the next commit's own writes). `probe` defaults to statvfs of `dir`
  // (tests pass their own).
  ReconstructionSpill(std::string dir, uint64_t capacity_bytes, SpaceProbe probe = {}, uint64_t memory_bytes = 0);
  ~ReconstructionSpill() override;
  ReconstructionSpill(const ReconstructionSpill&) = delete;
  ReconstructionSpill& operator=(const ReconstructionSpill&) = delete;

  // A reconstruction written but not yet kept under its blob's id (which is
  // known only once the blob is published). Dropping it frees its space.
  class Pending {
   public:
    Pending() = default;
    bool empty() const { return file_ == nullptr; }

   private:
    friend class ReconstructionSpill;
    explicit Pending(std::unique_ptr<DirectFile> file) : file_(std::move(file)) {}
    std::unique_ptr<DirectFile> file_;
  };

  // Writes `reconstruction` into a new unnamed file. A reconstruction
  // larger than the capacity, or one the filesystem has no room for (see
  // kFreeShare), gives an empty Pending; a write error an error, for the
  // log: the caller goes on without it. Thread-safe.
  Result<Pending> Write(ByteSpan reconstruction);
  // Keeps `pending` as `blob`'s reconstruction. `replaces`: a blob whose
  // kept reconstruction this one supersedes as the next base (the new
  // version's base when that is no anchor), dropped now. Then the least
  // recently used leave until the rest fits the capacity. Thread-safe.
  void Keep(const ObjectId& blob, Pending pending, const ObjectId* replaces = nullptr);
  // Keeps `memory` (alive while `owner` is) as `blob`'s reconstruction,
  // `replaces` as for Keep: in memory when it fits the memory bound, the
  // least recently used there written to their files (by this call) and
  // let go until the rest fits; else written to a file now. `demotes`: a
  // blob whose reconstruction leaves memory for its file now whatever the
  // bound (the new version's base when that is an anchor: later anchor
  // frames read it, the next version reads the new one), so that memory
  // holds one reconstruction per file being saved. A write that fails or
  // has no room leaves the reconstruction out (the log gets why through
  // `on_error`). Thread-safe.
  void KeepReconstruction(const ObjectId& blob, ByteSpan memory, std::shared_ptr<const void> owner,
                          const ObjectId* replaces, const ObjectId* demotes,
                          const std::function<void(const Status&)>& on_error);
  // Drops `blob`'s reconstruction, kept or held.
  void Drop(const ObjectId& blob);

  // A reconstruction in memory, served under its blob's id while the
  // holder lives: from the commit until its file is written and kept, so
  // that a read right after the commit neither waits for the write nor
  // decodes the chain. Not counted in bytes() or count().
  class Held {
   public:
    ~Held();
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;

   private:
    friend class ReconstructionSpill;
    Held(ReconstructionSpill* spill, const ObjectId& blob) : spill_(spill), blob_(blob) {}
    ReconstructionSpill* spill_;
    ObjectId blob_;
  };
  // Serves `bytes` (kept alive by `owner`) as `blob`'s reconstruction until
  // the returned holder goes. REQUIRES: the holder goes before the spill.
  // Thread-safe.
  std::shared_ptr<Held> Hold(const ObjectId& blob, ByteSpan bytes, std::shared_ptr<const void> owner);

  // The blobs whose reconstructions are kept now.
  std::vector<ObjectId> Blobs() const;

  // ChunkSpill.
  bool Read(const ObjectId& blob, uint64_t offset, MutableByteSpan out) override;
  std::optional<View> ViewInMemory(const ObjectId& blob, uint64_t offset, uint64_t length) override;
  void Forget(const ObjectId& blob) override { Drop(blob); }

  uint64_t bytes() const;
  size_t count() const;
  // Bytes of kept reconstructions read from memory now (count() counts
  // those too).
  uint64_t memory_bytes() const;
  uint64_t capacity_bytes() const { return capacity_; }

 private:
  // Where `blob`'s reconstruction is (made the most recently used): in its
  // file, or in memory (an entry's, or one held from commit to job).
  struct Found {
    bool kept = false;  // false: not kept at all
    std::shared_ptr<const DirectFile> file;  // null while it is in memory
    ByteSpan memory;
    std::shared_ptr<const void> owner;
  };
  Found Find(const ObjectId& blob);

  struct Entry {
    ObjectId blob;
    std::shared_ptr<const DirectFile> file;  // closed when its last reader lets go; null while in memory only
    ByteSpan memory;                         // the bytes in memory, or empty
    std::shared_ptr<const void> owner;       // freed when its last reader lets go
  };
  struct InMemory {
    ByteSpan bytes;
    std::shared_ptr<const void> owner;  // freed when its last reader lets go
    const Held* holder = nullptr;        // whose entry it is
  };
  Result<int> OpenUnnamed();
  // Whether `size` more bytes leave the filesystem its free share, after
  // dropping kept reconstructions (least recently used first) if needed.
  bool MakeRoom(uint64_t size);
  // Inserts an entry at the front, after dropping `blob`'s and `replaces`'
  // entries; then the least recently used files leave until the rest fit.
  void InsertLocked(const ObjectId& blob, const ObjectId* replaces, Entry entry,
                    std::vector<std::shared_ptr<const void>>* released);
  // Removes the entry; its file and memory go to `released`, to be freed
  // after the lock is released.
  void RemoveLocked(std::list<Entry>::iterator it, std::vector<std::shared_ptr<const void>>* released);

  const std::string dir_;
  const uint64_t capacity_;
  const SpaceProbe probe_;
  const uint64_t memory_capacity_;
  const std::shared_ptr<BounceWindows> windows_ = std::make_shared<BounceWindows>();
  mutable std::mutex mu_;  // leaf lock; never held during file I/O
  std::list<Entry> lru_;   // front = most recently kept or read
  std::unordered_map<ObjectId, std::list<Entry>::iterator, ObjectIdHash> map_;
  std::unordered_map<ObjectId, InMemory, ObjectIdHash> held_;
  uint64_t bytes_ = 0;
  uint64_t in_memory_ = 0;
};

}  // namespace ckptfs::fs
