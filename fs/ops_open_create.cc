// open, create, flush, release, fsync: where files enter and leave the
// STAGING state.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "fs/filesystem.h"

namespace ckptfs::fs {
namespace {
bool WantsWrite(int flags) { return (flags & O_ACCMODE) != O_RDONLY; }
}  // namespace

void Filesystem::Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  if (inode->is_dir()) return (void)fuse_reply_err(req, EISDIR);
  if (!inode->is_reg()) return (void)fuse_reply_err(req, EACCES);
  bool write = WantsWrite(fi->flags);
  bool truncate = write && (fi->flags & O_TRUNC);
  AttachedOpen attached;
  Status s = AttachOpen(*inode, write, truncate, &attached);
  if (!s.ok()) {
    log_->Warn("open of inode {} failed: {}", ino, s.ToString());
    return (void)fuse_reply_err(req, ToErrno(s));
  }
  // A file rewritten in place (a tracker, Lightning's last.ckpt) drops its
  // previous version as an unlink would: the retention rule applies to its
  // role (lossless deltas that do not pay start new chains).
  if (attached.replaces_version) NoteDeleted(RelativePath(*inode));
  if (truncate) ClearSetIdForCaller(req, *inode);
  FileHandle* handle = NewHandle(inode, write);
  handle->staged_bytes = std::move(attached.staged_bytes);  // no READ can come before the reply
  fi->fh = reinterpret_cast<uint64_t>(handle);
  fi->keep_cache = attached.keep_cache;
  fi->direct_io = 0;  // cached mode: mmap works
  if (fuse_reply_open(req, fi) != 0) DropUnsentHandle(handle);
}

void Filesystem::Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  auto dir = inodes_.Get(parent);
  if (!dir) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(parent, name)) return (void)fuse_reply_err(req, EPERM);
  int fd = ::openat(dir->fd, name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, mode & 07777);
  bool created = fd >= 0;
  if (!created && !(errno == EEXIST && !(fi->flags & O_EXCL))) return (void)fuse_reply_err(req, errno);
  if (created) {
    Status init = InitEmptyManifest(fd, false);
    ::close(fd);
    if (init.ok()) init = SetUpNewEntry(req, dir->fd, name, mode);
    if (!init.ok()) {
      ::unlinkat(dir->fd, name, 0);
      return (void)fuse_reply_err(req, ToErrno(init));
    }
  }
  fuse_entry_param e;
  Status s = DoLookup(*dir, name, &e);
  if (!s.ok()) return (void)fuse_reply_err(req, ToErrno(s));
  auto inode = inodes_.Get(e.ino);
  if (!inode || !inode->is_reg()) {
    if (inode) inodes_.Forget(e.ino, 1);
    return (void)fuse_reply_err(req, inode && inode->is_dir() ? EISDIR : EEXIST);
  }
  if (created) {
    std::lock_guard<std::mutex> lock(inode->mu);
    inode->file.entry_ticket = entry_syncs_.EntryMade();  // SyncEntryLocked
  }
  bool write = WantsWrite(fi->flags);
  bool truncate = write && (created || (fi->flags & O_TRUNC));
  AttachedOpen attached;
  s = AttachOpen(*inode, write, truncate, &attached);
  if (!s.ok()) {
    inodes_.Forget(e.ino, 1);
    return (void)fuse_reply_err(req, ToErrno(s));
  }
  if (!created && truncate) ClearSetIdForCaller(req, *inode);
  FileHandle* handle = NewHandle(inode, write);
  handle->staged_bytes = std::move(attached.staged_bytes);
  fi->fh = reinterpret_cast<uint64_t>(handle);
  fi->direct_io = 0;
  if (fuse_reply_create(req, &e, fi) != 0) DropUnsentHandle(handle);
}

// Without FUSE_CAP_HANDLE_KILLPRIV (Init) the kernel clears S_ISUID, and
// S_ISGID with group exec, by a SETATTR before a write or truncate, from the
// caller's real capabilities. Two cases are left to the daemon: the open
// of a file with O_TRUNC (with atomic O_TRUNC the kernel sends no SETATTR),
// and S_ISGID without group exec, which ext4 also clears for a writer
// outside the file's group but FUSE's conversion keeps. The request carries
// no capabilities: uid 0 stands for CAP_FSETID.
void Filesystem::ClearSetIdForCaller(fuse_req_t req, const Inode& inode) {
  if (fuse_req_ctx(req)->uid == 0) return;
  struct stat st;
  if (::fstatat(inode.fd, "", &st, AT_EMPTY_PATH) != 0 || (st.st_mode & (S_ISUID | S_ISGID)) == 0) return;
  mode_t mode = st.st_mode & 07777 & ~static_cast<mode_t>(S_ISUID);
  if ((mode & S_ISGID) && ((mode & S_IXGRP) || !CallerInGroup(req, st.st_gid))) mode &= ~static_cast<mode_t>(S_ISGID);
  if (mode != (st.st_mode & 07777) && ::chmod(inode.ProcPath().c_str(), mode) != 0)
    log_->Warn("clearing the set-ID bits of inode {}: {}", inode.ino, std::strerror(errno));
}

Status Filesystem::AttachOpen(Inode& inode, bool write, bool truncate, AttachedOpen* out) {
  std::unique_lock<std::mutex> lock(inode.mu);
  FileState& f = inode.file;
  // A reader then keeps the copied pages; no piece of the committed
  // version may land in the kernel's cache once a writer may change them.
  AwaitKernelCopyLocked(lock, inode, write || truncate);
  RETURN_IF_ERROR(LoadLocked(inode));
  // Close-to-open: an open sees what another daemon committed before it.
  struct stat st;
  if (::fstatat(inode.fd, "", &st, AT_EMPTY_PATH) == 0) RETURN_IF_ERROR(RevalidateLocked(inode, st));
  out->replaces_version =
      truncate && f.phase == FilePhase::kCommitted && f.has_manifest && f.manifest.kind == ManifestKind::kBlob;
  if (write) RETURN_IF_ERROR(EnsureStagingLocked(inode, truncate));
  if (write) ++f.writers;
  if (truncate) f.MarkChanged(/*touch_times=*/true);
  // The kernel may keep its cached pages only if the bytes did not change
  // since the last open.
  out->keep_cache = !truncate && f.cached_gen == f.content_gen;
  f.cached_gen = f.content_gen;
  // The kernel may serve this open's first reads from the pages its writer
  // left, so the daemon may never see them: the open is on the staged bytes
  // from the start (it may read past a commit).
  if (f.phase == FilePhase::kStaging || f.phase == FilePhase::kEncoding) out->staged_bytes = f.staging;
  ++f.handles;
  return Status::Ok();
}

void Filesystem::DropUnsentHandle(FileHandle* handle) {
  // The kernel will not send RELEASE for a handle it never saw.
  std::lock_guard<std::mutex> lock(handle->inode->mu);
  --handle->inode->file.handles;
  if (handle->writable && --handle->inode->file.writers == 0) MaybeQueueCommitLocked(handle->inode);
  DeleteHandle(handle);
}

void Filesystem::Flush(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
  // FLUSH comes on every close() (and may not come at all). Commits start at
  // the last RELEASE and durability is fsync's job; a writable handle is only
  // counted as closing, so `pending` covers the gap until its RELEASE.
  auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
  if (handle != nullptr && handle->writable && !handle->closing.exchange(true)) ++closing_handles_;
  fuse_reply_err(req, 0);
}

void Filesystem::Release(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
  auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
  {
    std::lock_guard<std::mutex> lock(handle->inode->mu);
    --handle->inode->file.handles;
    if (handle->writable && --handle->inode->file.writers == 0) MaybeQueueCommitLocked(handle->inode);
  }
  // After the commit is queued, so `pending` never drops to 0 in between.
  if (handle->closing) --closing_handles_;
  DeleteHandle(handle);
  fuse_reply_err(req, 0);
}

// The fsync promise: when fsync returns 0 on a file, its bytes as of that
// moment survive a crash or kill -9 of the daemon (and a power loss, as far
// as the backing filesystem honours fsync). With staging in the store, the
// staging file is fsynced and the manifest, fsynced too, names it; a
// remount commits it. With node-local staging the bytes are committed to
// the store before fsync returns, so they also survive losing the node,
// and every other node reads them (fs/STORE.md §3).
void Filesystem::Fsync(fuse_req_t req, fuse_ino_t /*ino*/, int datasync, fuse_file_info* fi) {
  auto* handle = reinterpret_cast<FileHandle*>(fi->fh);
  Inode& inode = *handle->inode;
  if (!store_->staging_in_store()) {
    Status s = CommitForFsync(handle->inode);
    if (!s.ok()) log_->Error("fsync of inode {} failed: {}", inode.ino, s.ToString());
    return (void)fuse_reply_err(req, ToErrno(s));
  }
  std::shared_ptr<StagingFile> staging;
  int manifest_fd = -1;
  {
    std::lock_guard<std::mutex> lock(inode.mu);
    if (inode.file.phase == FilePhase::kStaging || inode.file.phase == FilePhase::kEncoding)
      staging = inode.file.staging;
    auto mfd = ManifestFdLocked(inode);
    if (mfd.ok()) manifest_fd = *mfd;
  }
  if (!staging) {  // committed content is durable already; sync the metadata
    int rc = manifest_fd < 0 ? 0 : (datasync ? ::fdatasync(manifest_fd) : ::fsync(manifest_fd));
    if (rc != 0) return (void)fuse_reply_err(req, errno);
    std::lock_guard<std::mutex> lock(inode.mu);
    return (void)fuse_reply_err(req, ToErrno(SyncEntryLocked(inode)));
  }
  if (::fsync(staging->fd()) != 0) return (void)fuse_reply_err(req, errno);
  Status s;
  {
    std::lock_guard<std::mutex> lock(inode.mu);
    FileState& f = inode.file;
    if (f.staging == staging) {
      CommitOptions no_fault = commit_options_;
      no_fault.fault = nullptr;
      Result<int> mfd = RecordStagingLocked(inode, *staging, no_fault);
      s = mfd.status();
      if (s.ok() && ::fsync(*mfd) != 0) s = Status::Io(errno, "fsync manifest");
      if (s.ok()) s = SyncEntryLocked(inode);
    }
  }
  if (!s.ok()) log_->Error("fsync of inode {} failed: {}", inode.ino, s.ToString());
  fuse_reply_err(req, ToErrno(s));
}

Status Filesystem::CommitForFsync(const std::shared_ptr<Inode>& inode) {
  // The caller waits for the commit anyway, so it runs on this request
  // thread (with the encode's share of the cores, like a worker's commit).
  struct Counted {
    std::atomic<uint64_t>& n;
    explicit Counted(std::atomic<uint64_t>& c) : n(c) { ++n; }
    ~Counted() { --n; }
  } counted(fsync_commits_);
  // Writes that race with this fsync make the encoded bytes stale: encode
  // again (the bytes written before fsync was called are in every round).
  for (int round = 0; round < 8;) {
    std::shared_ptr<StagingFile> staging;
    uint64_t gen = 0;
    ino_t dir = 0;
    int manifest_fd = -1;
    {
      std::lock_guard<std::mutex> lock(inode->mu);
      FileState& f = inode->file;
      if (f.phase == FilePhase::kStaging && f.dirty) {
        staging = f.staging;
        gen = f.content_gen;
        dir = f.parent_dir;
      } else if (f.phase != FilePhase::kEncoding) {
        auto mfd = ManifestFdLocked(*inode);  // committed: durable already
        if (mfd.ok()) manifest_fd = *mfd;
      }
    }
    if (!staging) {
      if (manifest_fd >= 0) {
        if (::fdatasync(manifest_fd) != 0) return Status::Io(errno, "fsync manifest");
        std::lock_guard<std::mutex> lock(inode->mu);
        return SyncEntryLocked(*inode);
      }
      // A commit queued at the last release is running: its outcome is
      // the answer (a failed one leaves the file dirty and staging).
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    ++round;
    auto wanted = [&] {
      std::lock_guard<std::mutex> lock(inode->mu);
      return inode->file.staging == staging && inode->file.content_gen == gen;
    };
    // Registered until committed, so that later files of its folder wait
    // for it; an fsync itself waits for nothing (folder_commits.h).
    FolderCommits::Entry in_folder = folder_commits_.Enter(dir);
    Result<EncodedVersion> version = EncodeForCommit(*inode, *staging, dir, wanted, nullptr);
    if (!wanted()) continue;
    if (!version.ok()) return version.status();
    {
      std::lock_guard<std::mutex> lock(inode->mu);
      FileState& f = inode->file;
      if (f.staging != staging || f.content_gen != gen || f.phase != FilePhase::kStaging) continue;
      // Open writers go on writing to the staging file, which stays the
      // file's content until the last release finds it clean and drops it.
      RETURN_IF_ERROR(WriteCommitLocked(*inode, *version));
    }
    AfterCommit(inode, dir, *version, &in_folder);
    KeepReconstruction(*version);
    return Status::Ok();
  }
  return Status::Io(EBUSY, "fsync: the file kept changing while it was committed");
}

}  // namespace ckptfs::fs
