// The ckptfs FUSE daemon (libfuse3 low-level API). One Filesystem object,
// reached from every handler through fuse_req_userdata. Handlers are split
// by operation group: ops_dir.cc, ops_open_create.cc, ops_read_write.cc,
// ops_attr_xattr.cc; the per-file state machine and the commit job are in
// file_state.cc.
// Every handler replies exactly once, after releasing its locks, and maps
// errors through ToErrno; no exception crosses into libfuse.
#pragma once

#include "fs/inode.h"  // defines FUSE_USE_VERSION before fuse_lowlevel.h

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "fs/candidate_lists.h"
#include "fs/commit_pipeline.h"
#include "fs/encode_queue.h"
#include "fs/entry_syncs.h"
#include "fs/folder_commits.h"
#include "fs/log.h"
#include "fs/memory_budget.h"
#include "fs/options.h"
#include "fs/read_ahead.h"
#include "fs/store.h"

namespace ckptfs::fs {

// The errno for a Status at the FUSE boundary (EIO for corruption and
// checksum mismatches, the OS errno for I/O errors).
int ToErrno(const Status& status);

// Validates, mounts, (daemonizes,) serves until unmounted, drains pending
// commits and returns. InvalidArgument when BACKING and MOUNTPOINT overlap,
// Unsupported when the store has an unknown format version.
Status RunDaemon(const MountOptions& options);

// A bufvec of one memory buffer of SIZE bytes: what libfuse's
// FUSE_BUFVEC_INIT makes, without its C compound literal (not C++).
inline fuse_bufvec OneBufferVec(size_t size) {
  fuse_bufvec vec{};
  vec.count = 1;
  vec.buf[0].size = size;
  vec.buf[0].fd = -1;
  return vec;
}

// An open file (fuse_file_info::fh).
struct FileHandle {
  std::shared_ptr<Inode> inode;
  bool writable = false;
  // Set by the first FLUSH of a writable handle: close() has returned to the
  // writer, and the (asynchronous) RELEASE that queues the commit is on its
  // way. Counted in Filesystem::closing_handles_ until then.
  std::atomic<bool> closing{false};
  // The staging file this handle last read from (guarded by inode->mu):
  // after the commit of those bytes it keeps reading them, not the
  // reconstruction (FileState::committed_from).
  std::shared_ptr<StagingFile> staged_bytes;
  // Where this handle reads a committed blob (decoding ahead).
  ReadAhead::Stream read_stream;
};

// An open directory (fuse_file_info::fh).
struct DirHandle {
  DIR* dir = nullptr;
  ~DirHandle();
};

class Filesystem {
 public:
  Filesystem(const MountOptions& options, std::unique_ptr<Store> store, Logger* log);
  ~Filesystem();
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  // The operation table pointing at the handlers below.
  static const fuse_lowlevel_ops& Operations();

  // Starts the encode workers and the background GC (after daemonizing:
  // threads do not survive fork).
  void StartWorkers();
  // Waits for every queued commit, then stops the workers and GC.
  void StopWorkers();
  Store& store() { return *store_; }
  // What every commit uses: compression, key frames, the lossy policy.
  const CommitOptions& commit_options() const { return commit_options_; }
  Logger& log() { return *log_; }
  void set_session(fuse_session* se) { session_ = se; }

  // Handlers (one per FUSE operation).
  void Init(fuse_conn_info* conn);
  void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
  void Forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
  void ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets);
  void GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void SetAttr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
  void ReadLink(fuse_req_t req, fuse_ino_t ino);
  void MkNod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev);
  void MkDir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
  void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name);
  void RmDir(fuse_req_t req, fuse_ino_t parent, const char* name);
  void Symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name);
  void Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
              unsigned int flags);
  void Link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname);
  void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
  void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
  // Replies to a read of committed content at [start, start + size).
  void ReplyFromContent(fuse_req_t req, const Inode& inode, const FileContent& content, uint64_t start, size_t size);
  void Write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi);
  void Flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void Release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void Fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
  void OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
  void ReadDirPlus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
  void ReleaseDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void FsyncDir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
  void StatFs(fuse_req_t req, fuse_ino_t ino);
  void SetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags);
  void GetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
  void ListXattr(fuse_req_t req, fuse_ino_t ino, size_t size);
  void RemoveXattr(fuse_req_t req, fuse_ino_t ino, const char* name);
  void Fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length, fuse_file_info* fi);

 private:
  // --- helpers (file_state.cc) ---
  // The attributes the mount shows for `inode` (logical size for files).
  Result<struct stat> StatInode(Inode& inode);
  // Looks up `name` in `parent` and fills `e`, counting a lookup.
  Status DoLookup(Inode& parent, const char* name, fuse_entry_param* e);
  // REQUIRES: inode.mu held. Reads the manifest when not loaded yet.
  Status LoadLocked(Inode& inode);
  // REQUIRES: inode.mu held; loaded. Reads the manifest again when the
  // backing file's ctime (in `st`) moved since it was read, so that a
  // committed file shows another daemon's newer version.
  Status RevalidateLocked(Inode& inode, const struct stat& st);
  // REQUIRES: inode.mu held; loaded. The committed (or plain) content.
  Result<std::shared_ptr<const FileContent>> ContentLocked(Inode& inode);
  // REQUIRES: inode.mu held. The manifest file open for writing.
  Result<int> ManifestFdLocked(Inode& inode);
  // The staging file a write or fallocate through `handle` goes to, with
  // the file marked changed (a write also sets the pending mtime and tells
  // keep_cache the kernel holds these bytes); null when the handle cannot
  // write (EBADF). Takes inode.mu.
  std::shared_ptr<StagingFile> StagingForChange(FileHandle& handle, bool is_write);
  // Makes the manifest name `staging` (state staging, its current size and
  // the pending mtime), so a crash from here on recovers these bytes.
  // Returns the manifest fd. REQUIRES: inode.mu held.
  Result<int> RecordStagingLocked(Inode& inode, StagingFile& staging, const CommitOptions& options);
  // REQUIRES: inode.mu held; loaded. Puts the file in STAGING (cancelling
  // an encode, or copying the committed bytes into a new staging file
  // unless `truncate`).
  Status EnsureStagingLocked(Inode& inode, bool truncate);
  // REQUIRES: inode.mu held; loaded. Logical size of the file now.
  Result<uint64_t> SizeLocked(Inode& inode);
  // REQUIRES: inode.mu held. Called when no writer is left: queues the
  // commit, or drops an unchanged staging file.
  void MaybeQueueCommitLocked(const std::shared_ptr<Inode>& inode);
  // Runs on an encode worker: commits the staging file of `inode` unless
  // `ticket` was superseded. A DCP shard that no .metadata names yet waits
  // (the job is queued again) until one does or kAwaitDcpNames has passed
  // since `queued`; such a `retry` does not sync and mark the staging file
  // again when the try before did.
  void CommitJob(const std::shared_ptr<Inode>& inode, uint64_t ticket, std::chrono::steady_clock::time_point queued,
                 bool retry = false);
  // Encodes `staging` (the bytes of `inode`, in directory `dir`) into an
  // object with the mount's options and a share of the cores; gives up
  // (Internal) when `wanted` turns false while it waits for memory. With
  // `wait_after`, a file of at least kMinWaitingFileBytes first waits for
  // the commits of its folder that entered the list before that entry (at
  // most kWaitForEarlierInFolder). With `await_names`, an unnamed DCP shard
  // is not encoded (awaiting_names).
  Result<EncodedVersion> EncodeForCommit(Inode& inode, StagingFile& staging, ino_t dir,
                                         const std::function<bool()>& wanted, const FolderCommits::Entry* wait_after,
                                         bool await_names = false);
  static constexpr std::chrono::milliseconds kWaitForEarlierInFolder{60000};
  static constexpr uint64_t kMinWaitingFileBytes = 64 << 10;
  // REQUIRES: inode.mu held. Writes `version`'s manifest record (durable)
  // with the pending mtime; the file is clean afterwards.
  Status WriteCommitLocked(Inode& inode, const EncodedVersion& version);
  // After a durable manifest record of a file whose backing entry is not
  // known durable (FileState::entry_ticket): fsyncs the folder naming it,
  // unless an fsync of that folder already covered it (entry_syncs.h).
  Status SyncEntryLocked(Inode& inode);
  // After a commit, no lock held: the version becomes a delta-base
  // candidate (then `in_folder`, when given, leaves its folder's list), and
  // the kernel drops pages of a lossy file's staged bytes; its
  // reconstruction is queued to be copied into the kernel's page cache.
  void AfterCommit(const std::shared_ptr<Inode>& inode, ino_t dir, const EncodedVersion& version,
                   FolderCommits::Entry* in_folder = nullptr);
  // The page cache of a committed lossy file (fs/kernel_copy.cc): queues
  // the copy of `version`'s reconstruction over the staged bytes the kernel
  // cached, when nothing has the file open and it fits the kernel copy's
  // bound; false when it does not (the caller drops the pages instead).
  bool QueueKernelCopy(const std::shared_ptr<Inode>& inode, const EncodedVersion& version);
  // Copies `r` into the kernel's page cache of `inode`, a piece at a time,
  // while its bytes are still those of content generation `gen` and no
  // writer is open.
  void CopyToKernel(const std::shared_ptr<Inode>& inode, uint64_t gen, const EncodedVersion::Reconstruction& r);
  // REQUIRES: `lock` holds inode.mu. Waits for a running copy into the
  // kernel's cache, at most kKernelCopyWait; a `write`r that waited that
  // long makes the copy stop and drop what it copied.
  void AwaitKernelCopyLocked(std::unique_lock<std::mutex>& lock, Inode& inode, bool write);
  static constexpr std::chrono::milliseconds kKernelCopyWait{2000};
  // Queues version.after_commit (keeping its reconstruction) as background
  // work, not a pending commit; then the staging files in `release` are
  // let go of (closing an unlinked one drops its pages from the page cache,
  // a quarter of a second per gigabyte: no part of the commit either, and
  // after the reconstruction, which a read on this node may be waiting for).
  void KeepReconstruction(EncodedVersion& version, std::vector<std::shared_ptr<StagingFile>> release = {});
  // fsync with node-local staging: commits the file's bytes as of now to
  // the store (the staging file stays for open writers).
  Status CommitForFsync(const std::shared_ptr<Inode>& inode);
  // The delta-base candidates for the file at `rel_path` (relative to the
  // mount root) in directory `dir` (backing inode): the versions of its
  // directory and of its role (fs/version_role.h), merged by
  // MergeBaseCandidates. The first call for a directory or a role since
  // mount seeds its list from the store.
  // `*retention` says whether files of its role were deleted since mount.
  std::vector<BaseCandidate> BaseCandidatesFor(ino_t dir, const std::string& rel_path, bool* retention);
  // A file at `rel_path` (relative to the mount root) was deleted: its role
  // is rotated (a trainer's retention), so deltas of it that do not pay
  // start new chains (ChooseBase).
  void NoteDeleted(const std::string& rel_path);
  void AddBaseCandidate(ino_t dir, const BaseCandidate& candidate);
  void GcLoop();
  std::vector<ObjectId> LiveObjectsInMemory();
  // REQUIRES: inode.mu held. The virtual user.ckptfs.* attribute `name`.
  Result<std::string> VirtualXattrLocked(Inode& inode, std::string_view name);
  // True for the entry ".ckptfs" in the root directory (hidden).
  bool IsHidden(fuse_ino_t parent, const char* name) const;
  // Gives the entry `name` that the daemon just made in `dirfd` for the
  // caller of `req` what ext4 gives a new entry: the caller as owner, the
  // directory's group when the directory is set-group-ID (a new
  // subdirectory also gets the bit), the caller's group otherwise, and the
  // permission bits of `mode` less the caller's umask (never the
  // daemon's), with atime, mtime and ctime equal. Symlinks keep 0777.
  Status SetUpNewEntry(fuse_req_t req, int dirfd, const char* name, mode_t mode);
  // A write, truncate or open(O_TRUNC) of regular file `inode` by the
  // caller of `req`: clears the set-ID bits ext4 clears for a caller without
  // CAP_FSETID (S_ISUID; S_ISGID with group exec, or when the caller is
  // not in the file's group). Root (uid 0) keeps them. Best effort (logged).
  void ClearSetIdForCaller(fuse_req_t req, const Inode& inode);
  // True when the caller of `req` is in group `gid` (its own group or a
  // supplementary one).
  static bool CallerInGroup(fuse_req_t req, gid_t gid);
  void ReadDirCommon(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi, bool plus);

  const MountOptions options_;
  // Seconds the kernel may cache attributes and entries: 1 on a local
  // backing filesystem; 0 on a shared one, where another node's commit
  // must show at the next stat or open.
  double cache_timeout_ = 1.0;
  std::unique_ptr<Store> store_;
  Logger* log_;
  CommitOptions commit_options_;
  // The lossy kernel backend when gpu= selected a device (null: the CPU
  // reference, which needs no lock). One encode at a time uses it.
  std::unique_ptr<lossy::LossyKernels> gpu_kernels_;
  std::mutex gpu_mu_;
  // The path of `inode` relative to the backing root ("" if unknown), for
  // the lossy policy's file globs.
  std::string RelativePath(const Inode& inode) const;
  InodeTable inodes_;
  fuse_session* session_ = nullptr;
  // FUSE_CAP_DONT_MASK granted at INIT: the kernel leaves the caller's
  // umask (fuse_req_ctx()->umask) to the daemon. Written once, before any
  // other request.
  bool dont_mask_ = false;
  std::unique_ptr<EncodeQueue> queue_;
  // Decodes ahead of sequential readers (null before StartWorkers).
  std::unique_ptr<ReadAhead> read_ahead_;
  // mem=: encodes reserve their working set here before they start.
  MemoryBudget encode_budget_;
  // Encodes running now: the threads= cores are shared among them (a lone
  // commit, the common case of one torch.save, encodes its chunks on all).
  std::atomic<unsigned> running_encodes_{0};
  // Commits per folder in the order they started (folder_commits.h).
  FolderCommits folder_commits_;
  EntrySyncs entry_syncs_;
  // Writable handles closed by their process (FLUSH seen) whose RELEASE has
  // not arrived yet. Part of `user.ckptfs.pending`, so that "nothing
  // pending" right after a close() really means the commit has finished.
  std::atomic<uint64_t> closing_handles_{0};
  // fsyncs committing a file (node-local staging) right now: `pending`
  // counts them, so `ckptfs sync` and umount wait for them too.
  std::atomic<uint64_t> fsync_commits_{0};
  // Commits whose content digests came from the staged writes / from a
  // pass over the staged file (EncodedVersion::digests; root xattrs).
  std::atomic<uint64_t> digests_from_writes_{0};
  std::atomic<uint64_t> digests_hashed_at_commit_{0};

  // Open file handles, so that handles the kernel never released (a lazy
  // or aborted unmount) are freed at exit. Leaf lock.
  std::mutex handles_mu_;
  std::unordered_set<FileHandle*> handles_;
  FileHandle* NewHandle(std::shared_ptr<Inode> inode, bool writable);
  void DeleteHandle(FileHandle* handle);
  // What AttachOpen tells the open it attached.
  struct AttachedOpen {
    bool keep_cache = false;        // the kernel may keep its cached pages
    // A truncating open of a committed blob, whose version is then gone
    // from the tree (kept only as a delta base).
    bool replaces_version = false;
    // The staged bytes the open begins on (a file not yet committed): it
    // reads them to its end, whether the kernel's cache or the daemon
    // serves them (FileHandle::staged_bytes).
    std::shared_ptr<StagingFile> staged_bytes;
  };
  // Open and create (takes the inode's lock): load the file, move it into
  // staging for a writer (emptied when `truncate`), count the writer and
  // the handle.
  Status AttachOpen(Inode& inode, bool write, bool truncate, AttachedOpen* out);
  // Undoes NewHandle + AttachOpen for a handle whose reply failed.
  void DropUnsentHandle(FileHandle* handle);

  // How long the first save of a DCP run waits for its .metadata (written
  // by the coordinator once every rank's shard is written; on many nodes
  // the slowest rank decides), and how often it looks.
  static constexpr std::chrono::seconds kAwaitDcpNames{60};
  static constexpr std::chrono::milliseconds kAwaitDcpNamesPoll{250};
  static constexpr size_t kMaxBaseCandidates = 4;  // newest versions kept per list (and the newest anchor)
  static constexpr size_t kMaxCandidateLists = 256;  // per kind: directories, roles
  std::mutex bases_mu_;  // leaf lock; guards both lists
  CandidateLists dir_bases_{kMaxCandidateLists, kMaxBaseCandidates};   // keyed by the backing inode
  CandidateLists role_bases_{kMaxCandidateLists, kMaxBaseCandidates};  // keyed by FileRole::key
  static constexpr size_t kMaxRotatedRoles = 4096;  // forgotten all at once past this
  std::unordered_set<std::string> rotated_roles_;  // roles with a file deleted since mount

  std::mutex gc_mu_;  // leaf lock; guards gc_stop_
  std::condition_variable gc_cv_;
  bool gc_stop_ = false;
  std::thread gc_thread_;
};

}  // namespace ckptfs::fs
