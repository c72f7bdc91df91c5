// The per-file state machine (inode.h) and the commit job of the encode
// workers.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <future>

#include "fs/base_candidates.h"
#include "fs/dcp_names.h"
#include "fs/filesystem.h"

namespace ckptfs::fs {

Status Filesystem::LoadLocked(Inode& inode) {
  FileState& f = inode.file;
  if (f.phase != FilePhase::kUnloaded) return Status::Ok();
  int fd = OpenNoAtime(AT_FDCWD, inode.ProcPath().c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, "open manifest");
  struct stat st;
  // Taken before the read: a commit racing with it leaves a ctime that
  // differs, so the next revalidation reads again.
  if (::fstat(fd, &st) == 0) f.loaded_ctime = st.st_ctim;
  auto m = ReadManifest(fd);
  ::close(fd);
  if (!m.ok()) return m.status();
  if (m->has_value()) {
    f.manifest = **m;
    f.has_manifest = true;
    f.phase = FilePhase::kCommitted;
  } else {
    f.has_manifest = false;
    f.manifest = Manifest{};
    f.phase = FilePhase::kPlain;
  }
  return Status::Ok();
}

Status Filesystem::RevalidateLocked(Inode& inode, const struct stat& st) {
  FileState& f = inode.file;
  if (f.phase != FilePhase::kCommitted && f.phase != FilePhase::kPlain) return Status::Ok();
  if (st.st_ctim.tv_sec == f.loaded_ctime.tv_sec && st.st_ctim.tv_nsec == f.loaded_ctime.tv_nsec)
    return Status::Ok();
  // The backing file changed: a commit of another daemon sharing the store
  // (or this daemon's own, or a chmod). Read the manifest again; a new
  // record means new bytes.
  const Manifest before = f.manifest;
  const bool had_manifest = f.has_manifest;
  f.phase = FilePhase::kUnloaded;
  Status s = LoadLocked(inode);
  if (!s.ok()) {
    f.phase = had_manifest ? FilePhase::kCommitted : FilePhase::kPlain;
    f.manifest = before;
    f.has_manifest = had_manifest;
    return s;
  }
  bool same = had_manifest == f.has_manifest &&
              (!had_manifest || (before.sequence == f.manifest.sequence && before.object == f.manifest.object &&
                                 before.logical_size == f.manifest.logical_size));
  if (!same || !had_manifest) {  // a plain file may have been rewritten by anyone
    f.content.reset();
    f.committed_from.reset();
    ++f.content_gen;
  }
  return Status::Ok();
}

Result<std::shared_ptr<const FileContent>> Filesystem::ContentLocked(Inode& inode) {
  FileState& f = inode.file;
  if (f.content) return f.content;
  if (f.phase == FilePhase::kPlain) {
    ASSIGN_OR_RETURN(auto file, PosixFile::Open(inode.ProcPath()));
    f.content = std::make_shared<const FileContent>(FileContent::Verbatim(std::move(file)));
  } else {
    auto c = FileContent::Open(*store_, f.manifest);
    if (!c.ok()) {
      // A manifest whose object is missing or unreadable is a damaged
      // store: EIO, not the ENOENT of the object file.
      char where[PATH_MAX] = "?";
      ssize_t len = ::readlink(inode.ProcPath().c_str(), where, sizeof where - 1);
      where[len > 0 ? len : 1] = '\0';
      return Status::Corruption(std::string(where) + ": " + c.status().ToString());
    }
    f.content = std::make_shared<const FileContent>(std::move(*c));
  }
  return f.content;
}

Result<int> Filesystem::ManifestFdLocked(Inode& inode) {
  FileState& f = inode.file;
  if (f.manifest_fd < 0) {
    f.manifest_fd = OpenNoAtime(AT_FDCWD, inode.ProcPath().c_str(), O_RDWR | O_CLOEXEC);
    if (f.manifest_fd < 0) return Status::Io(errno, "open manifest for writing");
  }
  return f.manifest_fd;
}

Result<uint64_t> Filesystem::SizeLocked(Inode& inode) {
  FileState& f = inode.file;
  struct stat st;
  switch (f.phase) {
    case FilePhase::kStaging:
    case FilePhase::kEncoding:
      if (::fstat(f.staging->fd(), &st) != 0) return Status::Io(errno, "fstat staging");
      return static_cast<uint64_t>(st.st_size);
    case FilePhase::kPlain:
      if (::fstatat(inode.fd, "", &st, AT_EMPTY_PATH) != 0) return Status::Io(errno, "fstat");
      return static_cast<uint64_t>(st.st_size);
    case FilePhase::kCommitted: return f.manifest.logical_size;
    case FilePhase::kUnloaded: break;
  }
  return Status::Internal("size of an unloaded file");
}

Status Filesystem::EnsureStagingLocked(Inode& inode, bool truncate) {
  FileState& f = inode.file;
  if (f.phase == FilePhase::kEncoding) {
    // Supersede the queued/running commit. Its encoder may have the staging
    // file mapped: truncating it would SIGBUS the encoder, so the writer
    // gets a new staging file (a copy unless truncating).
    ++f.encode_ticket;
    ASSIGN_OR_RETURN(std::unique_ptr<StagingFile> fresh, store_->CreateStaging());
    struct stat st;
    if (::fstat(f.staging->fd(), &st) != 0) return Status::Io(errno, "fstat staging");
    loff_t in_off = 0;
    while (!truncate && in_off < st.st_size) {
      ssize_t n = ::copy_file_range(f.staging->fd(), &in_off, fresh->fd(), nullptr,
                                    static_cast<size_t>(st.st_size - in_off), 0);
      if (n <= 0) return Status::Io(n < 0 ? errno : EIO, "copy staging to " + fresh->path());
    }
    if (!truncate) fresh->digest().Invalidate();  // its bytes came from the copy, not from writes
    f.superseded.push_back(std::move(f.staging));
    f.staging = std::move(fresh);
    f.phase = FilePhase::kStaging;
    f.dirty = true;
    return Status::Ok();
  }
  if (f.phase == FilePhase::kStaging) {
    if (truncate) {
      if (::ftruncate(f.staging->fd(), 0) != 0) {
        const int error = errno;
        f.staging->digest().Invalidate();
        return Status::Io(error, "truncate staging");
      }
      f.staging->digest().Truncated(0);  // in-flight writes' tickets fail with it
    }
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StagingFile> staging, store_->CreateStaging());
  if (!truncate) {
    staging->digest().Invalidate();  // filled from the committed content below
    // Materialize: decode the committed bytes so that appends and in-place
    // updates work on a plain file.
    ASSIGN_OR_RETURN(auto content, ContentLocked(inode));
    std::vector<std::byte> buf(std::min<uint64_t>(content->size(), 4u << 20));
    for (uint64_t off = 0; off < content->size();) {
      uint64_t n = std::min<uint64_t>(buf.size(), content->size() - off);
      Status read = content->ReadAt(off, MutableByteSpan(buf.data(), n));
      if (!read.ok()) {
        log_->Error("materialize {}: {}", inode.ino, read.ToString());
        return read;
      }
      if (::pwrite(staging->fd(), buf.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n))
        return Status::Io(errno ? errno : ENOSPC, "write staging " + staging->path());
      off += n;
    }
  }
  f.staging = std::move(staging);
  f.phase = FilePhase::kStaging;
  f.dirty = truncate;
  return Status::Ok();
}

void Filesystem::MaybeQueueCommitLocked(const std::shared_ptr<Inode>& inode) {
  FileState& f = inode->file;
  if (f.writers > 0 || f.phase != FilePhase::kStaging) return;
  struct stat st;
  bool unlinked = ::fstatat(inode->fd, "", &st, AT_EMPTY_PATH) == 0 && st.st_nlink == 0;
  if (unlinked) {
    // Nothing names these any more; they go with the inode.
    f.staging->set_keep(false);
    for (auto& old : f.superseded) old->set_keep(false);
    return;
  }
  if (!f.dirty && !(f.has_manifest && f.manifest.kind == ManifestKind::kStaging)) {
    f.committed_from = f.staging;
    f.staging.reset();  // opened for writing but unchanged, or committed by fsync
    f.phase = f.has_manifest ? FilePhase::kCommitted : FilePhase::kPlain;
    ++f.content_gen;  // the kernel's pages hold the staged bytes, not a lossy reconstruction
    return;
  }
  f.phase = FilePhase::kEncoding;
  uint64_t ticket = ++f.encode_ticket;
  queue_->Push([this, inode, ticket, queued = std::chrono::steady_clock::now()] { CommitJob(inode, ticket, queued); });
}

Result<int> Filesystem::RecordStagingLocked(Inode& inode, StagingFile& staging, const CommitOptions& options) {
  FileState& f = inode.file;
  ASSIGN_OR_RETURN(int mfd, ManifestFdLocked(inode));
  struct stat st;
  if (::fstat(staging.fd(), &st) != 0) return Status::Io(errno, "fstat staging");
  if (f.has_manifest && f.manifest.kind == ManifestKind::kBlob) f.replaced_committed = f.manifest;
  RETURN_IF_ERROR(MarkStaging(mfd, &f.manifest, staging.id(), static_cast<uint64_t>(st.st_size), options));
  f.has_manifest = true;
  staging.set_keep(true);
  if (f.pending_mtime) {
    struct timespec times[2] = {{0, UTIME_OMIT}, *f.pending_mtime};
    ::futimens(mfd, times);
  }
  return mfd;
}

Result<EncodedVersion> Filesystem::EncodeForCommit(Inode& inode, StagingFile& staging, ino_t dir,
                                                   const std::function<bool()>& wanted,
                                                   const FolderCommits::Entry* wait_after, bool await_names) {
  struct stat st;
  const uint64_t size = ::fstat(staging.fd(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  // The files of its folder closed before it commit first: it may hold
  // weights they hold (folder_commits.h). Not counted as running meanwhile.
  // A file too small to hold a tensor worth sampling does not wait.
  if (wait_after != nullptr && size >= kMinWaitingFileBytes)
    folder_commits_.WaitForEarlier(*wait_after, kWaitForEarlierInFolder, [&] { return !wanted(); });
  // This commit's options: the mount's, with a share of the cores
  // (threads= shared among the encodes running now: a lone commit, one
  // torch.save, encodes its chunks on all of them; the output does not
  // depend on the thread count), the GPU backend when there is one (one
  // encode at a time uses it), and the retention rule when the file's old
  // versions are being deleted.
  struct RunningEncode {
    std::atomic<unsigned>& count;
    unsigned now;
    explicit RunningEncode(std::atomic<unsigned>& c) : count(c), now(++c) {}
    ~RunningEncode() { --count; }
  } running(running_encodes_);
  CommitOptions commit_options = commit_options_;
  commit_options.encode.threads = std::max(1u, options_.threads / running.now);
  // The working set of this many threads.
  MemoryBudget::Reservation memory = encode_budget_.Reserve(EncodeMemoryEstimate(size, commit_options));
  if (!wanted()) return Status::Internal("commit superseded");  // a writer came back while this waited
  std::unique_lock<std::mutex> gpu_lock(gpu_mu_, std::defer_lock);
  if (gpu_kernels_) {
    gpu_lock.lock();
    commit_options.encode.lossy_kernels = gpu_kernels_.get();
  }
  std::string rel_path = RelativePath(inode);
  bool retention = false;
  std::vector<BaseCandidate> candidates = BaseCandidatesFor(dir, rel_path, &retention);
  // The file's own previous version when a staging record (an fsync) took
  // its place in the manifest: kept in the folder's list too, as after any
  // commit of the daemon (the list is live for GC).
  std::optional<Manifest> replaced;
  {
    std::lock_guard<std::mutex> lock(inode.mu);
    replaced = inode.file.replaced_committed;
  }
  if (replaced)
    if (std::optional<BaseCandidate> own = AddReplacedCandidate(*store_, *replaced, rel_path, log_, &candidates))
      AddBaseCandidate(dir, *own);
  commit_options.retention = retention;
  commit_options.await_dcp_names = await_names;
  Result<EncodedVersion> version =
      EncodeStaged(*store_, staging, candidates, commit_options, log_, rel_path);
  if (version.ok() && version->digests == EncodedVersion::Digests::kFromWrites) ++digests_from_writes_;
  if (version.ok() && version->digests == EncodedVersion::Digests::kHashedAtCommit) ++digests_hashed_at_commit_;
  // after_commit holds the encode's reconstruction until it has run. With
  // mem= it runs now, within this encode's reservation (a background job
  // holding a reservation could wait behind commits waiting for it);
  // otherwise after the commit, as a background job.
  if (version.ok() && version->after_commit && options_.mem_mib != 0) {
    if (gpu_lock.owns_lock()) gpu_lock.unlock();  // other encodes may use the device meanwhile
    auto keep = std::exchange(version->after_commit, nullptr);
    if (wanted()) keep();  // a superseded version is no base
  }
  return version;
}

Status Filesystem::WriteCommitLocked(Inode& inode, const EncodedVersion& version) {
  FileState& f = inode.file;
  ASSIGN_OR_RETURN(int mfd, ManifestFdLocked(inode));
  RETURN_IF_ERROR(CommitManifest(mfd, &f.manifest, version, commit_options_));
  f.has_manifest = true;
  if (f.pending_mtime) {
    struct timespec times[2] = {{0, UTIME_OMIT}, *f.pending_mtime};
    ::futimens(mfd, times);
  }
  f.pending_mtime.reset();
  f.content.reset();
  f.dirty = false;
  f.replaced_committed.reset();
  // The commit is done whatever this gives: a failure keeps the ticket, and
  // the file's next fsync or commit tries again.
  if (Status s = SyncEntryLocked(inode); !s.ok())
    log_->Error("inode {}: its folder could not be fsynced after the commit: {}", inode.ino, s.ToString());
  return Status::Ok();
}

// The first durable record of a file created through the mount (its
// commit, or an fsync) is followed by an fsync of the folder naming it now,
// and of the new folders above it (fs/entry_syncs.h); a file found on disk,
// or synced once, costs nothing more. A rename of a file whose entry is
// durable is as durable as on the backing filesystem: once its folder is
// fsynced (FsyncDir passes that through). Runs under inode.mu: rarely more
// than one folder fsync per commit round of a folder.
Status Filesystem::SyncEntryLocked(Inode& inode) {
  FileState& f = inode.file;
  if (f.entry_ticket == 0) return Status::Ok();
  Status synced;
  // The folder is found by the entry's current path; a rename of it
  // between the readlink and the fsync (ENOENT) is tried again.
  for (int attempt = 0; attempt < 3; ++attempt) {
    struct stat st;
    if (::fstat(inode.fd, &st) != 0) return Status::Io(errno, "fstat manifest");
    char path[PATH_MAX];
    const ssize_t n = ::readlink(inode.ProcPath().c_str(), path, sizeof path);
    if (n <= 0 || static_cast<size_t>(n) >= sizeof path)
      return Status::Io(n < 0 ? errno : ENAMETOOLONG, "readlink manifest");
    const std::string_view name(path, static_cast<size_t>(n));
    // Unlinked (or this name of a hard link removed): no entry to keep.
    if (st.st_nlink == 0 || name.ends_with(" (deleted)")) break;
    const size_t slash = name.rfind('/');
    synced = entry_syncs_.Sync(slash == 0 ? std::string("/") : std::string(name.substr(0, slash)), f.entry_ticket);
    if (synced.ok() || synced.sys_errno() != ENOENT) break;
  }
  RETURN_IF_ERROR(synced);
  f.entry_ticket = 0;
  return Status::Ok();
}

void Filesystem::AfterCommit(const std::shared_ptr<Inode>& inode_ptr, ino_t dir, const EncodedVersion& version,
                             FolderCommits::Entry* in_folder) {
  Inode& inode = *inode_ptr;
  log_->Debug("committed inode {}: {} bytes -> {} ({} bytes, depth {})", inode.ino, version.fields.logical_size,
              StorageName(version.fields),
              version.fields.kind == ManifestKind::kInline ? version.fields.inline_data.size() : version.fields.stored_bytes,
              version.fields.chain_depth);
  if (version.as_base) AddBaseCandidate(dir, *version.as_base);
  // Its folder's later commits may go on now: it is their candidate.
  if (in_folder != nullptr) in_folder->Release();
  if (version.fields.kind == ManifestKind::kBlob && session_ != nullptr) {
    // The reconstruction of a lossy codec differs from the staged bytes the
    // kernel may have cached: they are overwritten by it (QueueKernelCopy)
    // or dropped. An exact blob leaves them as they are. The attributes
    // are refreshed either way. Called with no lock held, since the kernel
    // may wait on a READ of this inode.
    const bool keep_pages = version.exact || QueueKernelCopy(inode_ptr, version);
    int rc = fuse_lowlevel_notify_inval_inode(session_, inode.ino, keep_pages ? -1 : 0, 0);
    if (rc != 0 && rc != -ENOENT) log_->Debug("notify_inval_inode({}): {}", inode.ino, rc);
  }
}

void Filesystem::CommitJob(const std::shared_ptr<Inode>& inode, uint64_t ticket,
                           std::chrono::steady_clock::time_point queued, bool retry) {
  std::shared_ptr<StagingFile> staging;
  ino_t dir;
  bool marked = false;  // the try before this one (waiting for a DCP .metadata) marked it
  {
    std::lock_guard<std::mutex> lock(inode->mu);
    if (inode->file.encode_ticket != ticket || inode->file.phase != FilePhase::kEncoding) return;
    staging = inode->file.staging;
    dir = inode->file.parent_dir;
    const Manifest& m = inode->file.manifest;
    marked = retry && inode->file.has_manifest && m.kind == ManifestKind::kStaging && m.staging == staging->id();
  }
  auto wanted = [&] {
    std::lock_guard<std::mutex> lock(inode->mu);
    return inode->file.encode_ticket == ticket;
  };
  // In the store, the staging file is made durable while it is encoded: its
  // fsync takes about as long as writing it to the disk, and the encode
  // only needs its bytes, which are in the page cache. Both finish before
  // anything is recorded, in the order recovery relies on: the staging
  // file durable, then marked in the manifest, then the object and the new
  // manifest. A node-local staging file is never named by the store: a
  // close is committed by the encode alone (fsync commits, fs/STORE.md §3).
  bool mark = store_->staging_in_store() && !marked;
  std::future<Status> synced;
  if (mark) synced = std::async(std::launch::async, [&staging, this] { return SyncStaging(*staging, commit_options_); });
  // A DCP run's first save: its shards' tensor names arrive with the
  // .metadata the coordinator writes after them. Waiting a little for it
  // stores the save lossily instead of bit for bit.
  const bool await_names = !queue_->hurry() && std::chrono::steady_clock::now() - queued < kAwaitDcpNames;
  if (retry && await_names && !mark && !FolderHasDcpMetadata(*store_, RelativePath(*inode))) {
    // Still nothing to name the shard by: wait again without mapping and
    // parsing the whole shard (a DCP shard may be gigabytes).
    queue_->PushAfter(kAwaitDcpNamesPoll, [this, inode, ticket, queued] { CommitJob(inode, ticket, queued, true); });
    return;
  }
  // Registered in its folder until it is committed (folder_commits.h).
  FolderCommits::Entry in_folder = folder_commits_.Enter(dir);
  Result<EncodedVersion> version = EncodeForCommit(*inode, *staging, dir, wanted, &in_folder, await_names);
  if (!wanted()) {
    if (mark) (void)synced.get();
    return;  // superseded: the object is garbage for GC
  }
  // Marked even when the encode failed: the staging file then stays the
  // file's content, and the next release or a remount retries.
  Status s = mark ? synced.get() : Status::Ok();
  if (s.ok() && mark) {
    std::lock_guard<std::mutex> lock(inode->mu);
    if (inode->file.encode_ticket != ticket) return;
    s = RecordStagingLocked(*inode, *staging, commit_options_).status();
  }
  if (!s.ok()) version = s;
  if (version.ok() && version->awaiting_names) {
    // The staging file is the content meanwhile (durable and named by the
    // manifest when staging lives in the store). Queued again as the same
    // job: a writer that comes back supersedes it by its ticket.
    queue_->PushAfter(kAwaitDcpNamesPoll, [this, inode, ticket, queued] { CommitJob(inode, ticket, queued, true); });
    return;
  }
  std::shared_ptr<StagingFile> done;
  std::vector<std::shared_ptr<StagingFile>> superseded;  // no manifest names them now
  {
    std::lock_guard<std::mutex> lock(inode->mu);
    FileState& f = inode->file;
    if (f.encode_ticket != ticket) return;  // superseded: the object is garbage for GC
    s = version.ok() ? WriteCommitLocked(*inode, *version) : version.status();
    if (!s.ok()) {
      // The staging file stays the content (durable if MarkStaging
      // succeeded); the next release or a remount retries.
      log_->Error("commit of inode {} failed, keeping its staging file: {}", inode->ino, s.ToString());
      f.phase = FilePhase::kStaging;
      return;
    }
    f.phase = FilePhase::kCommitted;
    f.committed_from = f.staging;
    done = std::move(f.staging);
    superseded.swap(f.superseded);
  }
  if (Status r = RemoveStagingFile(*done, commit_options_); !r.ok())
    log_->Warn("removing staging file {}: {}", done->path(), r.ToString());
  for (auto& old : superseded) (void)old->Remove();
  AfterCommit(inode, dir, *version, &in_folder);
  inodes_.EraseIfUnused(inode->ino);
  staging.reset();  // `done` holds it too
  superseded.push_back(std::move(done));
  KeepReconstruction(*version, std::move(superseded));
}

void Filesystem::KeepReconstruction(EncodedVersion& version, std::vector<std::shared_ptr<StagingFile>> release) {
  // Pointless when the daemon is about to stop (the spill goes with it);
  // a sync (Hurry) still keeps it. (Then `release` goes now.)
  if (!queue_ || queue_->stopping() || (!version.after_commit && release.empty())) return;
  queue_->PushBackground([keep = std::move(version.after_commit), release = std::move(release)]() mutable {
    if (keep) keep();
    release.clear();
  });
}

Result<struct stat> Filesystem::StatInode(Inode& inode) {
  struct stat st;
  if (::fstatat(inode.fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return Status::Io(errno, "stat");
  st.st_ino = inode.ino;
  if (!inode.is_reg()) return st;
  std::lock_guard<std::mutex> lock(inode.mu);
  RETURN_IF_ERROR(LoadLocked(inode));
  RETURN_IF_ERROR(RevalidateLocked(inode, st));
  ASSIGN_OR_RETURN(uint64_t size, SizeLocked(inode));
  st.st_size = static_cast<off_t>(size);
  FileState& f = inode.file;
  if (f.phase == FilePhase::kStaging || f.phase == FilePhase::kEncoding) {
    struct stat sst;
    if (::fstat(f.staging->fd(), &sst) == 0) st.st_blocks = sst.st_blocks;
  } else if (f.phase == FilePhase::kCommitted) {
    uint64_t stored = f.manifest.kind == ManifestKind::kInline ? f.manifest.inline_data.size() : f.manifest.stored_bytes;
    st.st_blocks = static_cast<blkcnt_t>((stored + 511) / 512);
  }
  if (f.pending_mtime) {
    // A write changes mtime and ctime (POSIX); the manifest file's own
    // ctime only moves at the commit.
    st.st_mtim = *f.pending_mtime;
    auto later = [](const timespec& a, const timespec& b) {
      return a.tv_sec != b.tv_sec ? a.tv_sec > b.tv_sec : a.tv_nsec > b.tv_nsec;
    };
    if (later(*f.pending_mtime, st.st_ctim)) st.st_ctim = *f.pending_mtime;
  }
  return st;
}

Status Filesystem::DoLookup(Inode& parent, const char* name, fuse_entry_param* e) {
  int fd = ::openat(parent.fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, std::string("lookup ") + name);
  struct stat st;
  if (::fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Io(err, std::string("stat ") + name);
  }
  std::shared_ptr<Inode> inode = inodes_.FindOrInsert(fd, st);
  if (!inode) return Status::Io(EXDEV, std::string("inode number clash for ") + name);
  if (inode->is_reg()) {
    std::lock_guard<std::mutex> lock(inode->mu);
    inode->file.parent_dir = parent.backing_ino;
  }
  auto attr = StatInode(*inode);
  if (!attr.ok()) {
    inodes_.Forget(inode->ino, 1);
    return attr.status();
  }
  std::memset(e, 0, sizeof *e);
  e->ino = inode->ino;
  e->generation = inode->generation;
  e->attr = *attr;
  e->attr_timeout = cache_timeout_;
  e->entry_timeout = cache_timeout_;
  return Status::Ok();
}

std::string Filesystem::RelativePath(const Inode& inode) const {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(inode.ProcPath().c_str(), buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) return {};
  std::string_view path(buf, static_cast<size_t>(n));
  const std::string& root = store_->backing();
  if (!path.starts_with(root) || path.size() <= root.size() || path[root.size()] != '/') return {};
  return std::string(path.substr(root.size() + 1));
}

}  // namespace ckptfs::fs
