// The inode table of the daemon: one Inode per backing (dev, ino) the
// kernel knows about, with its lookup count (FORGET) and generation, and
// for regular files the per-file state machine
//   COMMITTED/PLAIN --open for write--> STAGING --last writer release-->
//   ENCODING --commit--> COMMITTED;  ENCODING --open for write--> STAGING
// (the open bumps encode_ticket, so the worker's commit is abandoned).
//
// LOCK ORDER: InodeTable::mu_ before Inode::mu; never two Inode::mu at
// once; Store and Logger locks are leaves. No lock is held across a
// fuse_reply_* call.
#pragma once

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "fs/commit_pipeline.h"
#include "fs/manifest.h"
#include "fs/store.h"

namespace ckptfs::fs {

enum class FilePhase {
  kUnloaded,   // manifest not read yet
  kPlain,      // a backing file without manifest magic: served verbatim
  kCommitted,  // content from the manifest (inline, object)
  kStaging,    // content in the staging file; writers may be open
  kEncoding,   // content in the staging file; queued on or in an encode worker
};
std::string_view FilePhaseName(FilePhase phase);

// Per-file state. Guarded by Inode::mu.
struct FileState {
  FilePhase phase = FilePhase::kUnloaded;
  bool has_manifest = false;
  Manifest manifest;                              // current record (sequence!)
  std::shared_ptr<const FileContent> content;     // kPlain/kCommitted, opened lazily
  std::shared_ptr<StagingFile> staging;           // kStaging/kEncoding
  // Staging files of cancelled encodes (an encoder may still map them, so
  // they are never truncated or reused); removed after the next commit.
  std::vector<std::shared_ptr<StagingFile>> superseded;
  uint64_t encode_ticket = 0;                     // bumped to cancel a queued encode
  uint32_t writers = 0;                           // open handles with write access
  uint32_t handles = 0;                           // open handles, read or write
  // A committed version's reconstruction is being copied into the kernel's
  // page cache (fs/kernel_copy.cc): an open or truncate waits for it
  // (Inode::kernel_copy_done); a writer that waited too long marks the copy
  // `raced`, and it stops and drops what it copied.
  bool kernel_copy_running = false;
  bool kernel_copy_raced = false;
  bool dirty = false;                             // staging differs from the committed content
  uint64_t content_gen = 1;                       // bumped by every change of the bytes
  uint64_t cached_gen = 0;                        // content_gen at the last open (keep_cache)
  std::optional<struct timespec> pending_mtime;   // mtime of writes not yet in the manifest
  int manifest_fd = -1;                           // O_RDWR on the manifest, opened lazily
  // ctime of the backing file when the manifest was read: another daemon's
  // commit changes it (RevalidateLocked).
  struct timespec loaded_ctime {};
  ino_t parent_dir = 0;                           // last directory seen naming it (delta scope)
  // The committed blob record a staging record replaced (an fsync before
  // the commit): the version the commit that follows deltas against, which
  // a folder scan after a remount no longer finds in the manifest.
  std::optional<Manifest> replaced_committed;
  // For a file this daemon created (create, mknod), its EntrySyncs ticket
  // until the folder that names it has been fsynced (the backing entry is
  // durable only then; Filesystem::SyncEntryLocked); 0 otherwise.
  uint64_t entry_ticket = 0;
  // The staging file whose bytes the committed content was encoded from
  // (what readers got until the commit). A handle that read them goes on
  // reading them (FileHandle::staged_bytes), so that one open never mixes
  // staged bytes with a lossy reconstruction: a copy made while the file
  // is being committed gets one version or the other, whole.
  std::weak_ptr<StagingFile> committed_from;

  // The bytes changed: a new content generation, differing from the
  // committed content. `touch_times` (write, truncate) also sets mtime and
  // ctime to now, from the coarse clock the kernel stamps the manifest's
  // ctime with at the commit, so that ctime never lands before this mtime.
  void MarkChanged(bool touch_times) {
    dirty = true;
    ++content_gen;
    if (touch_times) ::clock_gettime(CLOCK_REALTIME_COARSE, &pending_mtime.emplace());
  }
};

struct Inode {
  Inode(fuse_ino_t ino_, uint64_t generation_, dev_t dev_, ino_t backing_ino_, mode_t type_, int fd_)
      : ino(ino_), generation(generation_), dev(dev_), backing_ino(backing_ino_), type(type_), fd(fd_) {}
  ~Inode();
  Inode(const Inode&) = delete;
  Inode& operator=(const Inode&) = delete;

  const fuse_ino_t ino;
  const uint64_t generation;
  const dev_t dev;
  const ino_t backing_ino;
  const mode_t type;  // S_IFREG, S_IFDIR, S_IFLNK, ...
  const int fd;       // O_PATH|O_NOFOLLOW on the backing entry; owned
  uint64_t nlookup = 0;  // guarded by InodeTable::mu_

  std::mutex mu;  // guards `file`
  FileState file;
  std::condition_variable kernel_copy_done;  // with `mu`: file.kernel_copy_running went false

  bool is_dir() const { return S_ISDIR(type); }
  bool is_reg() const { return S_ISREG(type); }
  // "/proc/self/fd/<fd>": reopens the entry (O_PATH fds allow nothing else).
  std::string ProcPath() const { return "/proc/self/fd/" + std::to_string(fd); }
};

// Thread safety: all methods are thread-safe.
class InodeTable {
 public:
  // REQUIRES: root_fd is an O_PATH fd of the backing root (owned from now).
  explicit InodeTable(int root_fd);
  std::shared_ptr<Inode> root() const { return root_; }
  // The inode for `ino`, or nullptr.
  std::shared_ptr<Inode> Get(fuse_ino_t ino);
  // Finds or creates the inode of the entry open at `path_fd` (with stat
  // `st`) and counts one lookup. Closes path_fd when the inode exists. A
  // null result means an inode-number clash with another device (EXDEV).
  std::shared_ptr<Inode> FindOrInsert(int path_fd, const struct stat& st);
  // Looks up an inode by its backing identity without counting a lookup.
  std::shared_ptr<Inode> FindByBacking(dev_t dev, ino_t ino);
  // Drops `n` lookups; the inode leaves the table when none remain and its
  // file is idle (not staging or encoding).
  void Forget(fuse_ino_t ino, uint64_t n);
  // Removes the inode if it has no lookups and is idle (after a commit).
  void EraseIfUnused(fuse_ino_t ino);
  std::vector<std::shared_ptr<Inode>> Snapshot();

 private:
  bool IdleLocked(Inode& inode);

  std::mutex mu_;
  std::shared_ptr<Inode> root_;
  std::map<fuse_ino_t, std::shared_ptr<Inode>> inodes_;
  uint64_t next_generation_ = 1;
};

}  // namespace ckptfs::fs
