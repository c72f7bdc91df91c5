// The store on the backing directory (fs/STORE.md documents the layout):
//   BACKING/.ckptfs/format            store format version ("ckptfs-store 1")
//   BACKING/.ckptfs/objects/ab/<hex>  immutable content-addressed objects
//   BACKING/.ckptfs/staging/<area>/   one staging area per live daemon
//                                     (or LOCAL/<area>/ with -o staging=LOCAL)
//   BACKING/.ckptfs/tmp/<area>/       temp files of that daemon
//   BACKING/<user tree>               directories, manifests, symlinks
// A Store also resolves blob ids to open BlobReaders (a small cache), so it
// is the BlobResolver of every reader it opens.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "codec/common/hash.h"
#include "codec/common/io.h"
#include "codec/container/blob.h"
#include "fs/manifest.h"
#include "fs/reconstruction_spill.h"
#include "fs/staged_digest.h"

namespace ckptfs::fs {

inline constexpr char kMetaDirName[] = ".ckptfs";
inline constexpr uint32_t kStoreFormatVersion = 1;

// A file under .ckptfs/tmp that is unlinked on destruction unless
// published. Moves only.
class TempFile {
 public:
  TempFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  TempFile(TempFile&& o) noexcept : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)) {}
  TempFile& operator=(TempFile&&) = delete;
  ~TempFile();
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Closes the fd and forgets the path (after a rename moved it away).
  void Release();

 private:
  int fd_;
  std::string path_;
};

// A staging file (the write-ahead copy of a file being written), open
// O_RDWR. On destruction the fd is closed and the file unlinked unless a
// durable manifest references it (keep) or it was removed already.
// Thread safety: fd() may be used concurrently (pread/pwrite); the flags
// are atomic.
class StagingFile {
 public:
  // `hash_writes`: the digests follow the file's writes from its first
  // truncate to zero on (Store::CreateStaging: from now); otherwise (and
  // for a file recovery found) they are never known.
  StagingFile(StagingId id, int fd, std::string path, bool hash_writes = false)
      : id_(id), fd_(fd), path_(std::move(path)), digest_(hash_writes) {}
  ~StagingFile();
  StagingFile(const StagingFile&) = delete;
  StagingFile& operator=(const StagingFile&) = delete;
  const StagingId& id() const { return id_; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // The digests of the bytes written so far (unknown for a file recovery
  // found; Store::CreateStaging starts them on the empty file).
  StagedDigest& digest() { return digest_; }
  const StagedDigest& digest() const { return digest_; }
  // Marks the file as referenced by a durable manifest: never unlinked by
  // the destructor (recovery owns it after a crash or exit).
  void set_keep(bool keep) { keep_ = keep; }
  // Unlinks the file now (after the manifest replacing it is durable).
  Status Remove();

 private:
  StagingId id_;
  int fd_;
  std::string path_;
  std::atomic<bool> keep_{false};
  std::atomic<bool> removed_{false};
  StagedDigest digest_;
};

struct StoreOptions {
  bool create = true;              // create .ckptfs/ when absent
  uint64_t chunk_cache_bytes = 256ull << 20;
  // Idle chunk buffers kept beyond chunk_cache_bytes (ChunkCache).
  uint64_t chunk_cache_idle_reserve = 0;
  // Awaited chunks kept beyond chunk_cache_bytes (ChunkCache).
  uint64_t chunk_cache_awaited_bytes = 0;
  size_t max_open_readers = 256;   // BlobReaders kept open by id
  // Where this daemon's staging area lives: empty for BACKING/.ckptfs/
  // staging, else a directory outside the store (a node-local disk when
  // the store is shared: fs/STORE.md §3). No manifest ever names a staging
  // file there, so nothing but this node's next mount ever looks at it.
  std::string local_staging;
  // Keep the reconstructions of the versions this daemon writes in its
  // staging area (fs/reconstruction_spill.h), at most
  // `reconstruction_spill_bytes` (0: ReconstructionSpill::DefaultCapacity).
  // Only where the staging area is on this node's own disk (not a shared
  // filesystem, not tmpfs).
  bool reconstruction_spill = false;
  uint64_t reconstruction_spill_bytes = 0;
  // Of those, the most recent up to this many bytes stay in memory too.
  uint64_t reconstruction_memory_bytes = 0;
  // Staging files hash their writes as they arrive (fs/staged_digest.h):
  // for mounts whose commits look content up in the index. A mount that
  // stores files as they are (compress=off) never reads the digests, and
  // its writes skip the hashing.
  bool hash_staged_writes = true;
};

class Store final : public BlobResolver {
 public:
  // Opens (and when allowed creates) the store of `backing`. Unsupported if
  // .ckptfs/format names another version; NotFound if absent and !create.
  static Result<std::unique_ptr<Store>> Open(const std::string& backing, const StoreOptions& options);
  ~Store() override;

  const std::string& backing() const { return backing_; }
  int backing_fd() const { return backing_fd_; }
  // BACKING/.ckptfs/<rel>.
  std::string MetaPath(std::string_view rel) const;
  std::string ObjectPath(const ObjectId& id) const;
  // The staging file a manifest names: always in the store (a node-local
  // staging file is never named; this daemon's own are under StagingRoot()).
  std::string StagingPath(const StagingId& id) const { return MetaPath(id.RelPath()); }

  // Claims a staging area for this process (staging/<area>/ holding an
  // exclusive flock on its .lock for the process lifetime). REQUIRES: once.
  Status ClaimStagingArea();
  // At a clean exit (also run by the destructor): removes the claimed area
  // when nothing is left in it (staging files named by durable manifests
  // stay for recovery).
  void ReleaseStagingArea();
  // True when staging files are in the store (the default), false with a
  // node-local staging directory (their fsync then commits: fs/STORE.md §3).
  bool staging_in_store() const { return options_.local_staging.empty(); }
  // The directory holding the staging areas of this daemon's placement.
  std::string StagingRoot() const { return staging_in_store() ? MetaPath("staging") : options_.local_staging; }
  // The claimed area's 16 hex digits ("" before ClaimStagingArea).
  const std::string& area() const { return area_; }
  // A new empty staging file in the claimed area. Thread-safe.
  Result<std::unique_ptr<StagingFile>> CreateStaging();
  // A new temp file in tmp/<area>/ (or tmp/ for tools). Thread-safe.
  Result<TempFile> CreateTemp();
  // Makes `tmp` the object named by the XXH3-128 of its bytes: fsync, mode
  // 0444, rename to objects/ab/<hex>, fsync the directory. When the object
  // exists already its mtime is refreshed instead (so that GC's grace
  // period protects it until the caller's manifest references it).
  Result<ObjectId> PublishObject(TempFile tmp);
  // Refreshes an object's mtime, so that GC's grace period protects it while
  // a commit uses it as a delta base. NotFound when GC removed it already.
  Status TouchObject(const ObjectId& id);

  // BlobResolver: opens objects/<id> as a blob (cached by id). Thread-safe.
  Result<std::shared_ptr<const BlobReader>> OpenBlob(const ObjectId& id) override;
  // Forgets cached readers and kept reconstructions (the spill) whose
  // object file is gone (removed by a GC, possibly another process's):
  // their open fds would keep its space allocated. Returns how many readers
  // and reconstructions. Thread-safe.
  size_t DropRemovedObjects();
  // Opens a raw object (compress=off). Thread-safe.
  Result<std::shared_ptr<const RandomAccessFile>> OpenRaw(const ObjectId& id);
  ChunkCache* chunk_cache() { return &cache_; }
  // The reconstructions kept in the staging area (null without one: no
  // claimed area, or not asked for). Its chunks serve the cache's readers.
  ReconstructionSpill* reconstruction_spill() { return spill_.get(); }

 private:
  Store(std::string backing, int backing_fd, const StoreOptions& options);
  std::string NewRandomHex16();

  const std::string backing_;
  const int backing_fd_;
  const StoreOptions options_;
  std::unique_ptr<ReconstructionSpill> spill_;  // unset from cache_ and freed first in ~Store
  ChunkCache cache_;
  std::string area_;
  int area_lock_fd_ = -1;  // flock on <staging root>/<area>/.lock
  int tmp_lock_fd_ = -1;   // flock on tmp/<area>/.lock (local staging only)
  std::atomic<uint64_t> counter_{0};

  std::mutex readers_mu_;  // leaf lock; never held while opening a blob
  std::list<ObjectId> reader_order_;  // most recent first
  std::unordered_map<ObjectId, std::shared_ptr<const BlobReader>, ObjectIdHash> readers_;
};

// Runs `fn(relative_path)` for every regular file of the user tree of
// `backing` (skipping .ckptfs, not following symlinks), depth first,
// without moving the directories' atimes. Thread safety: reentrant.
Status ForEachUserFile(const std::string& backing, const std::function<void(const std::string&)>& fn);

// openat(2) with O_NOATIME, or without it where the kernel refuses it
// (EPERM: the daemon neither owns the file nor holds CAP_FOWNER). The
// daemon's own reads of manifests and directories (lookups, commits,
// recovery, GC) are not the user's: a user file's atime is its manifest's,
// and moves only as on ext4. Thread safety: reentrant.
int OpenNoAtime(int dirfd, const char* path, int flags);

// fsyncs the directory at `path`.
Status SyncDir(const std::string& path);

}  // namespace ckptfs::fs
