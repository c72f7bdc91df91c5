#include "fs/filesystem.h"
#include "fs/staging_placement.h"

#include "gpu/lossy_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <vector>

#include "fs/base_candidates.h"
#include "fs/content_index.h"
#include "fs/version_role.h"
#include "fs/gc.h"
#include "fs/memory_budget.h"
#include "fs/recovery.h"

namespace ckptfs::fs {

int ToErrno(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return 0;
    case StatusCode::kIo:
    case StatusCode::kNoSpace: return status.sys_errno() != 0 ? status.sys_errno() : EIO;
    case StatusCode::kNotFound: return ENOENT;
    case StatusCode::kInvalidArgument: return EINVAL;
    case StatusCode::kUnsupported: return EOPNOTSUPP;
    case StatusCode::kNoMemory: return ENOMEM;
    case StatusCode::kCorruption:
    case StatusCode::kChecksumMismatch:
    case StatusCode::kInternal: return EIO;
  }
  return EIO;
}

DirHandle::~DirHandle() {
  if (dir != nullptr) ::closedir(dir);
}

Filesystem::Filesystem(const MountOptions& options, std::unique_ptr<Store> store, Logger* log)
    : options_(options),
      store_(std::move(store)),
      log_(log),
      inodes_(::open(store_->backing().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)),
      encode_budget_(SplitMemory(options).encode_mib << 20) {
  if (IsSharedFilesystem(store_->backing())) cache_timeout_ = 0.0;
  commit_options_.compress = options.compress;
  commit_options_.level = options.level;
  commit_options_.release_input_pages = options.mem_mib != 0;
  commit_options_.keyframe = options.keyframe;
  commit_options_.encode.zstd_level = options.zstd_level;
  commit_options_.encode.threads = 1;  // each commit: threads= shared among the running encodes
  commit_options_.policy = options.policy;
  commit_options_.in_flight = std::make_shared<ContentInFlight>();
  commit_options_.encode.budget_schedule = options.schedule;
  commit_options_.encode.step_prediction = options.step_prediction;
  commit_options_.encode.low_rank_moments = options.low_rank_moments;
  commit_options_.encode.trellis = options.trellis;
  commit_options_.encode.momentum_dither = options.momentum_dither;
  commit_options_.encode.momentum_step_space = options.momentum_step_space;
  commit_options_.coding = CodingSignature(commit_options_.encode);
  if (options.lossy && options.gpu != lossy::GpuMode::kOff) {
    Result<std::unique_ptr<lossy::LossyKernels>> kernels = gpu::SelectLossyKernels(options.gpu);
    if (!kernels.ok()) {
      log_->Warn("gpu={}: no GPU lossy backend, using the CPU: {}", options.gpu == lossy::GpuMode::kOn ? "on" : "auto",
                 kernels.status().ToString());
    } else if (*kernels && !(*kernels)->name().starts_with("cpu")) {
      log_->Info("lossy codec on the {} backend", (*kernels)->name());
      gpu_kernels_ = std::move(*kernels);
    }
  }
  if (!options.crash_at.empty()) {
    std::string step = options.crash_at;
    Logger* l = log_;
    commit_options_.fault = [step, l](std::string_view at) {
      if (at == step) {
        l->Error("crash_at={}: aborting as requested (fault injection)", step);
        struct rlimit no_core = {0, 0};  // an injected crash needs no core file
        ::setrlimit(RLIMIT_CORE, &no_core);
        std::abort();
      }
      return Status::Ok();
    };
  }
}

Filesystem::~Filesystem() {
  StopWorkers();
  for (FileHandle* h : handles_) delete h;
}

FileHandle* Filesystem::NewHandle(std::shared_ptr<Inode> inode, bool writable) {
  auto* h = new FileHandle{std::move(inode), writable};
  std::lock_guard<std::mutex> lock(handles_mu_);
  handles_.insert(h);
  return h;
}

void Filesystem::DeleteHandle(FileHandle* handle) {
  if (read_ahead_) read_ahead_->Close(handle->read_stream);
  {
    std::lock_guard<std::mutex> lock(handles_mu_);
    handles_.erase(handle);
  }
  delete handle;
}

void Filesystem::StartWorkers() {
  unsigned workers = options_.threads;
  if (uint64_t budget = encode_budget_.capacity(); budget != 0) {
    // Each worker keeps its working set between encodes: mem= allows only
    // as many workers as the encode half of the bound holds (at least one).
    uint64_t fit = std::max<uint64_t>(1, budget / EncodeWorkingSet(commit_options_));
    workers = static_cast<unsigned>(std::min<uint64_t>(workers, fit));
    log_->Info("mem={} MiB: {} encode worker(s), {} MiB decoded chunk cache", options_.mem_mib, workers,
               SplitMemory(options_).cache_mib);
  }
  queue_ = std::make_unique<EncodeQueue>(workers);
  // The window lives in the chunk cache: a quarter of it at most, so the
  // chunks decoded ahead are not evicted by each other before they are read.
  uint64_t window_mib = std::min(options_.decode_ahead_mib, SplitMemory(options_).cache_mib / 4);
  // The kernel's read-ahead (readahead=) runs that far ahead of the
  // reader, whose own reads of the pages it missed come behind: chunks are
  // dropped twice that far behind the furthest read (a shorter lag made the
  // daemon decode them twice), and at least one chunk's worth behind.
  const uint64_t drop_lag = std::max<uint64_t>(2 * (uint64_t{options_.read_ahead_kb} << 10), 8 << 20);
  read_ahead_ = std::make_unique<ReadAhead>(options_.threads, window_mib << 20, drop_lag);
  if (options_.gc_interval_seconds > 0) gc_thread_ = std::thread([this] { GcLoop(); });
}

void Filesystem::StopWorkers() {
  if (read_ahead_) {
    log_->Info("decode ahead: {} chunks decoded ahead of readers ({} queued for a predicted next tensor)",
               read_ahead_->decodes_started(), read_ahead_->predicted_queued());
    read_ahead_.reset();
  }
  if (queue_) {
    queue_->Drain();
    queue_.reset();
    if (encode_budget_.capacity() != 0)
      log_->Info("mem: {} encodes waited for memory", encode_budget_.waits());
  }
  {
    std::lock_guard<std::mutex> lock(gc_mu_);
    gc_stop_ = true;
  }
  gc_cv_.notify_all();
  if (gc_thread_.joinable()) gc_thread_.join();
}

std::vector<ObjectId> Filesystem::LiveObjectsInMemory() {
  std::vector<ObjectId> live;
  for (auto& inode : inodes_.Snapshot()) {
    std::lock_guard<std::mutex> lock(inode->mu);
    const Manifest& m = inode->file.manifest;
    if (inode->file.has_manifest && (m.kind == ManifestKind::kBlob || m.kind == ManifestKind::kRaw))
      live.push_back(m.object);
  }
  std::lock_guard<std::mutex> lock(bases_mu_);
  dir_bases_.AppendIds(&live);
  role_bases_.AppendIds(&live);
  return live;
}

void Filesystem::GcLoop() {
  std::unique_lock<std::mutex> lock(gc_mu_);
  for (;;) {
    if (gc_cv_.wait_for(lock, std::chrono::seconds(options_.gc_interval_seconds), [this] { return gc_stop_; }))
      return;
    lock.unlock();
    GcOptions gc;
    gc.grace_seconds = options_.gc_grace_seconds;
    gc.extra_live = LiveObjectsInMemory();
    auto report = CollectGarbage(*store_, gc, log_);
    if (!report.ok()) log_->Warn("background gc failed: {}", report.status().ToString());
    store_->DropRemovedObjects();
    lock.lock();
  }
}

void Filesystem::NoteDeleted(const std::string& rel_path) {
  std::string role = RoleOf(rel_path).key;
  if (role.empty()) return;
  std::lock_guard<std::mutex> lock(bases_mu_);
  if (rotated_roles_.size() >= kMaxRotatedRoles) rotated_roles_.clear();
  rotated_roles_.insert(std::move(role));
}

std::vector<BaseCandidate> Filesystem::BaseCandidatesFor(ino_t dir, const std::string& rel_path, bool* retention) {
  const std::string dir_key = std::to_string(dir);
  const FileRole role = RoleOf(rel_path);
  std::vector<BaseCandidate> in_dir, in_role;
  bool have_dir, have_role;
  {
    std::lock_guard<std::mutex> lock(bases_mu_);
    *retention = rotated_roles_.count(role.key) != 0;
    have_dir = dir_bases_.Get(dir_key, &in_dir);
    have_role = role.key.empty() || role_bases_.Get(role.key, &in_role);
  }
  // The first commit of a directory or role since mount scans the store
  // (manifests and blob indexes), without the lock; two racing first
  // commits both scan and the first to finish seeds the list.
  if (!have_dir) {
    std::vector<BaseCandidate> scanned = ScanBaseCandidates(*store_, rel_path, kMaxBaseCandidates, log_);
    if (!scanned.empty()) log_->Debug("delta bases for {}: {} in its folder", rel_path, scanned.size());
    std::lock_guard<std::mutex> lock(bases_mu_);
    dir_bases_.Seed(dir_key, std::move(scanned));
    dir_bases_.Get(dir_key, &in_dir);
  }
  if (!have_role) {
    std::vector<BaseCandidate> scanned = ScanRoleCandidates(*store_, rel_path, kMaxBaseCandidates, log_);
    if (!scanned.empty()) log_->Debug("delta bases for {}: {} of its role", rel_path, scanned.size());
    std::lock_guard<std::mutex> lock(bases_mu_);
    role_bases_.Seed(role.key, std::move(scanned));
    role_bases_.Get(role.key, &in_role);
  }
  return MergeBaseCandidates(role, std::move(in_dir), std::move(in_role));
}

void Filesystem::AddBaseCandidate(ino_t dir, const BaseCandidate& candidate) {
  const std::string role = RoleOf(candidate.rel_path).key;
  std::lock_guard<std::mutex> lock(bases_mu_);
  dir_bases_.Remember(std::to_string(dir), candidate);
  if (!role.empty()) role_bases_.Remember(role, candidate);
}

bool Filesystem::IsHidden(fuse_ino_t parent, const char* name) const {
  return parent == FUSE_ROOT_ID && std::strcmp(name, kMetaDirName) == 0;
}

// libfuse reads the supplementary groups from /proc/PID/status.
bool Filesystem::CallerInGroup(fuse_req_t req, gid_t gid) {
  if (fuse_req_ctx(req)->gid == gid) return true;
  std::vector<gid_t> groups(64);
  int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
  if (n > static_cast<int>(groups.size())) {
    groups.resize(static_cast<size_t>(n));
    n = fuse_req_getgroups(req, n, groups.data());
  }
  if (n <= 0) return false;
  groups.resize(std::min(groups.size(), static_cast<size_t>(n)));
  return std::find(groups.begin(), groups.end(), gid) != groups.end();
}

Status Filesystem::SetUpNewEntry(fuse_req_t req, int dirfd, const char* name, mode_t mode) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  int fd = ::openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, std::string("open new entry ") + name);
  struct stat dir, st;
  if (::fstat(dirfd, &dir) != 0 || ::fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Io(err, std::string("stat new entry ") + name);
  }
  const bool setgid_dir = (dir.st_mode & S_ISGID) != 0;
  // The entry was made under the daemon's own umask: its mode is set here
  // from the request, less the caller's umask when the kernel left that to
  // us (FUSE_CAP_DONT_MASK); otherwise the kernel already applied it.
  mode_t perm = mode & 07777;
  if (dont_mask_) perm &= ~ctx->umask;
  if (S_ISDIR(st.st_mode) && setgid_dir) perm |= S_ISGID;  // subdirectories inherit the bit
  // A new file of a set-group-ID directory whose group the caller is not in
  // loses S_ISGID (ext4's inode_init_owner). Recent kernels strip it before
  // the request; older ones leave it to the file system.
  if (!S_ISDIR(st.st_mode) && setgid_dir && (perm & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP) && ctx->uid != 0 &&
      !CallerInGroup(req, dir.st_gid))
    perm &= ~S_ISGID;
  if (::geteuid() == 0) {
    gid_t gid = setgid_dir ? dir.st_gid : ctx->gid;
    if (::fchownat(fd, "", ctx->uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0)
      log_->Warn("chown {} to {}:{} failed: {}", name, ctx->uid, gid, std::strerror(errno));
  }
  Status s;
  // After the chown: chown clears the set-ID bits of a file.
  if (!S_ISLNK(st.st_mode)) {
    std::string proc = "/proc/self/fd/" + std::to_string(fd);
    if (::chmod(proc.c_str(), perm) != 0) s = Status::Io(errno, std::string("chmod new entry ") + name);
  }
  // ext4 gives a new entry one timestamp; the manifest write, chown and
  // chmod above moved mtime and ctime past atime.
  const struct timespec now[2] = {{0, UTIME_NOW}, {0, UTIME_NOW}};
  if (s.ok() && ::utimensat(fd, "", now, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0)
    log_->Debug("utimensat of new entry {}: {}", name, std::strerror(errno));
  ::close(fd);
  return s;
}

void Filesystem::Init(fuse_conn_info* conn) {
  conn->max_write = 1u << 20;
  if (conn->capable & FUSE_CAP_EXPORT_SUPPORT) conn->want |= FUSE_CAP_EXPORT_SUPPORT;
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_WRITEBACK_CACHE);
  conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
  // The daemon knows when a file's bytes change under the kernel's cache:
  // a commit (AfterCommit drops or replaces the pages), another daemon's
  // commit or a plain file changed in the backing directory (the next open
  // says !keep_cache, RevalidateLocked). The kernel's own guess from a
  // changed mtime would drop good pages: after writes its mtime is its own
  // clock's, the daemon reports the one it stamped, and the first
  // attribute refresh after the commit would drop the reconstruction just
  // copied into the cache (fs/kernel_copy.cc).
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_AUTO_INVAL_DATA);
  // The caller's umask comes with create/mkdir/mknod and SetUpNewEntry
  // applies it, so that the requested mode arrives intact (and the
  // daemon's own umask never counts).
  if (conn->capable & FUSE_CAP_DONT_MASK) {
    conn->want |= FUSE_CAP_DONT_MASK;
    dont_mask_ = true;
  }
  // With HANDLE_KILLPRIV (libfuse 3.14's default) the kernel leaves the
  // clearing of set-ID bits on write/truncate/chown to the daemon, but a
  // WRITE does not say whether the writer holds CAP_FSETID (that needs
  // HANDLE_KILLPRIV_V2, which 3.14 lacks). Without it the kernel decides as
  // for ext4 (should_remove_suid) and sends a SETATTR of the mode.
  conn->want &= ~static_cast<unsigned>(FUSE_CAP_HANDLE_KILLPRIV);
  MemorySplit memory = SplitMemory(options_);
  log_->Info("ckptfs mounted {} on {} (level={}, lossy={}, budget={}, compress={}, threads={}, keyframe={}, "
             "cache={} MiB, encode memory={})",
             options_.backing, options_.mountpoint, options_.level, options_.lossy ? "on" : "off", options_.budget,
             options_.compress ? "on" : "off", options_.threads,
             options_.keyframe, memory.cache_mib,
             memory.encode_mib ? std::to_string(memory.encode_mib) + " MiB" : std::string("unbounded"));
}

namespace {
Filesystem* Self(fuse_req_t req) { return static_cast<Filesystem*>(fuse_req_userdata(req)); }

// No exception crosses into libfuse: a handler that throws (an allocation
// failure) has not replied yet, so the request gets ENOMEM/EIO.
template <typename F>
void Guard(fuse_req_t req, F&& handler) {
  try {
    handler();
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (...) {
    fuse_reply_err(req, EIO);
  }
}

fuse_lowlevel_ops MakeOperations() {
  fuse_lowlevel_ops ops{};
  ops.init = [](void* userdata, fuse_conn_info* conn) { static_cast<Filesystem*>(userdata)->Init(conn); };
  ops.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { Guard(r, [&] { Self(r)->Lookup(r, p, n); }); };
  ops.forget = [](fuse_req_t r, fuse_ino_t i, uint64_t n) { Self(r)->Forget(r, i, n); };
  ops.forget_multi = [](fuse_req_t r, size_t c, fuse_forget_data* f) { Self(r)->ForgetMulti(r, c, f); };
  ops.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { Guard(r, [&] { Self(r)->GetAttr(r, i, fi); }); };
  ops.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info* fi) {
    Guard(r, [&] { Self(r)->SetAttr(r, i, a, s, fi); });
  };
  ops.readlink = [](fuse_req_t r, fuse_ino_t i) { Guard(r, [&] { Self(r)->ReadLink(r, i); }); };
  ops.mknod = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, dev_t d) { Guard(r, [&] { Self(r)->MkNod(r, p, n, m, d); }); };
  ops.mkdir = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m) { Guard(r, [&] { Self(r)->MkDir(r, p, n, m); }); };
  ops.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { Guard(r, [&] { Self(r)->Unlink(r, p, n); }); };
  ops.rmdir = [](fuse_req_t r, fuse_ino_t p, const char* n) { Guard(r, [&] { Self(r)->RmDir(r, p, n); }); };
  ops.symlink = [](fuse_req_t r, const char* l, fuse_ino_t p, const char* n) { Guard(r, [&] { Self(r)->Symlink(r, l, p, n); }); };
  ops.rename = [](fuse_req_t r, fuse_ino_t p, const char* n, fuse_ino_t np, const char* nn, unsigned int f) {
    Guard(r, [&] { Self(r)->Rename(r, p, n, np, nn, f); });
  };
  ops.link = [](fuse_req_t r, fuse_ino_t i, fuse_ino_t np, const char* nn) { Guard(r, [&] { Self(r)->Link(r, i, np, nn); }); };
  ops.open = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { Guard(r, [&] { Self(r)->Open(r, i, fi); }); };
  ops.read = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) { Guard(r, [&] { Self(r)->Read(r, i, s, o, fi); }); };
  ops.write = [](fuse_req_t r, fuse_ino_t i, const char* b, size_t s, off_t o, fuse_file_info* fi) {
    Guard(r, [&] { Self(r)->Write(r, i, b, s, o, fi); });
  };
  ops.flush = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { Guard(r, [&] { Self(r)->Flush(r, i, fi); }); };
  ops.release = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { Guard(r, [&] { Self(r)->Release(r, i, fi); }); };
  ops.fsync = [](fuse_req_t r, fuse_ino_t i, int d, fuse_file_info* fi) { Guard(r, [&] { Self(r)->Fsync(r, i, d, fi); }); };
  ops.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { Guard(r, [&] { Self(r)->OpenDir(r, i, fi); }); };
  ops.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) {
    Guard(r, [&] { Self(r)->ReadDir(r, i, s, o, fi); });
  };
  ops.readdirplus = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t o, fuse_file_info* fi) {
    Guard(r, [&] { Self(r)->ReadDirPlus(r, i, s, o, fi); });
  };
  ops.releasedir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { Guard(r, [&] { Self(r)->ReleaseDir(r, i, fi); }); };
  ops.fsyncdir = [](fuse_req_t r, fuse_ino_t i, int d, fuse_file_info* fi) { Guard(r, [&] { Self(r)->FsyncDir(r, i, d, fi); }); };
  ops.statfs = [](fuse_req_t r, fuse_ino_t i) { Guard(r, [&] { Self(r)->StatFs(r, i); }); };
  ops.setxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, const char* v, size_t s, int f) {
    Guard(r, [&] { Self(r)->SetXattr(r, i, n, v, s, f); });
  };
  ops.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) { Guard(r, [&] { Self(r)->GetXattr(r, i, n, s); }); };
  ops.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { Guard(r, [&] { Self(r)->ListXattr(r, i, s); }); };
  ops.removexattr = [](fuse_req_t r, fuse_ino_t i, const char* n) { Guard(r, [&] { Self(r)->RemoveXattr(r, i, n); }); };
  ops.create = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, fuse_file_info* fi) {
    Guard(r, [&] { Self(r)->Create(r, p, n, m, fi); });
  };
  ops.fallocate = [](fuse_req_t r, fuse_ino_t i, int m, off_t o, off_t l, fuse_file_info* fi) {
    Guard(r, [&] { Self(r)->Fallocate(r, i, m, o, l, fi); });
  };
  return ops;
}

// Canonical absolute path, or the error.
Result<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return Status::Io(errno, "resolve " + path);
  return std::string(buf);
}

bool IsInside(const std::string& inner, const std::string& outer) {
  return inner == outer || (inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
                            (outer == "/" || inner[outer.size()] == '/'));
}

// Raises the readahead of the new mount's bdi (best effort): stat() of the
// mountpoint needs the session loop, so this runs on its own thread.
void RaiseReadAhead(const std::string& mountpoint, uint32_t kb, Logger* log) {
  struct stat st;
  if (kb == 0 || ::stat(mountpoint.c_str(), &st) != 0) return;
  std::string path = "/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)) +
                     "/read_ahead_kb";
  std::ofstream f(path);
  if (f) f << kb << "\n";
  if (!f) log->Debug("could not set {} to {}", path, kb);
  else log->Debug("set {} to {}", path, kb);
}
bool BackingIsReadOnly(const std::string& backing) {
  struct statvfs st;
  return ::statvfs(backing.c_str(), &st) == 0 && (st.f_flag & ST_RDONLY) != 0;
}
}  // namespace

const fuse_lowlevel_ops& Filesystem::Operations() {
  static const fuse_lowlevel_ops ops = MakeOperations();
  return ops;
}

Status RunDaemon(const MountOptions& options) {
  ASSIGN_OR_RETURN(std::string backing, RealPath(options.backing));
  ASSIGN_OR_RETURN(std::string mountpoint, RealPath(options.mountpoint));
  if (IsInside(backing, mountpoint))
    return Status::InvalidArgument("backing directory " + backing + " is inside (or equal to) the mountpoint " +
                                   mountpoint + ": the daemon would deadlock on its own mount");
  if (IsInside(mountpoint, backing))
    return Status::InvalidArgument("mountpoint " + mountpoint + " is inside the backing directory " + backing);
  Logger log(options.log_level);
  if (!options.log_file.empty() && !log.OpenFile(options.log_file))
    return Status::Io(errno, "open log file " + options.log_file);
  StoreOptions store_options;
  store_options.chunk_cache_bytes = SplitMemory(options).cache_mib << 20;
  store_options.chunk_cache_awaited_bytes = SplitMemory(options).awaited_mib << 20;
  // Two chunk buffers per decoding thread (read-ahead workers, and the
  // request thread beside them) stay idle even when the cache is full: a
  // torch.load fills the cache with second moments it reads much later
  // (torch.save writes storages in the text order of their keys, and
  // decoding a first moment in step space decodes its second moment), and
  // without them every decode at capacity touched fresh memory (152 fresh
  // 4 MiB buffers against 198 reused for one cold 957 MB load).
  // With mem= the reserve comes out of the cache's half (a quarter of it
  // at most), so that the bound holds.
  uint64_t idle_reserve = uint64_t{options.threads + 1} * 2 * EncodeOptions{}.chunk_bytes;
  if (options.mem_mib != 0) {
    idle_reserve = std::min(idle_reserve, store_options.chunk_cache_bytes / 4);
    store_options.chunk_cache_bytes -= idle_reserve;
  }
  store_options.chunk_cache_idle_reserve = idle_reserve;
  std::string staging_why;
  ASSIGN_OR_RETURN(store_options.local_staging, ResolveStaging(options, backing, &staging_why));
  // Reconstructions are kept beside the staging files where those are on
  // this node's disk (the store checks the staging area's filesystem).
  store_options.reconstruction_spill = true;
  // The newest of them stay in memory as well, up to an eighth of the
  // machine's (the page cache held them before they were written around
  // it); with mem= none do, outside its bound.
  store_options.reconstruction_memory_bytes = options.mem_mib == 0 ? PhysicalMemoryBytes() / 8 : 0;
  store_options.hash_staged_writes = options.compress;  // compress=off never looks content up
  // A read-only backing directory (or -o ro) mounts read-only: no staging
  // area, no recovery, no GC; files a dead daemon left in staging are
  // served from their staging files.
  bool read_only = BackingIsReadOnly(backing) ||
                   std::find(options.fuse_options.begin(), options.fuse_options.end(), "ro") !=
                       options.fuse_options.end();
  store_options.create = !read_only;
  ASSIGN_OR_RETURN(auto store, Store::Open(backing, store_options));
  if (!read_only) {
    RETURN_IF_ERROR(store->ClaimStagingArea());
    if (store->staging_in_store()) log.Debug("staging in the store ({})", staging_why);
    else log.Info("staging in {} ({}); fsync commits to the store", store->StagingRoot(), staging_why);
  }

  MountOptions resolved = options;
  if (read_only) {
    log.Warn("{} is read-only: mounting read-only (no writes, no recovery, no GC)", backing);
    resolved.gc_interval_seconds = 0;
    if (std::find(resolved.fuse_options.begin(), resolved.fuse_options.end(), "ro") == resolved.fuse_options.end())
      resolved.fuse_options.push_back("ro");
  }
  ASSIGN_OR_RETURN(resolved.policy, BuildLossyPolicy(options));
  if (options.gpu == lossy::GpuMode::kOn && options.lossy) {
    // gpu=on is a promise: refuse to mount without the device.
    RETURN_IF_ERROR(gpu::SelectLossyKernels(options.gpu).status().WithContext("-o gpu=on"));
  }
  resolved.backing = backing;
  resolved.mountpoint = mountpoint;
  auto fs = std::make_unique<Filesystem>(resolved, std::move(store), &log);
  if (!read_only) {
    // Recovery before mounting: the mount command returns a recovered store.
    // The daemon's own commit settings (policy, key frames, compression),
    // without the crash_at hook, which is for the daemon's commits.
    CommitOptions recovery_options = fs->commit_options();
    recovery_options.fault = nullptr;
    recovery_options.encode.threads = std::max(1u, options.threads);
    auto report = RecoverStore(fs->store(), recovery_options, &log);
    if (!report.ok()) return report.status().WithContext("recovery");
    if (report->dead_areas > 0)
      log.Info("recovery: {} dead staging areas, {} commits finished, {} lost, {} orphans removed",
               report->dead_areas, report->finished, report->lost, report->orphans_removed);
  }

  std::string fuse_opts = "fsname=" + backing + ",subtype=ckptfs";
  for (const std::string& o : resolved.fuse_options) fuse_opts += "," + o;
  auto has = [&](std::string_view flag) {
    return std::find(resolved.fuse_options.begin(), resolved.fuse_options.end(), flag) !=
           resolved.fuse_options.end();
  };
  if ((has("allow_other") || has("allow_root")) && !has("default_permissions")) {
    // The daemon runs as root and checks no permissions itself: letting
    // other users in without the kernel's checks would let anyone read
    // every file.
    fuse_opts += ",default_permissions";
    log.Info("allow_other/allow_root: adding default_permissions (the kernel checks modes)");
  }
  std::vector<std::string> argv_s = {"ckptfs", "-o", fuse_opts};
  if (options.debug_fuse) argv_s.push_back("-d");
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_session* se = fuse_session_new(&args, &Filesystem::Operations(), sizeof(fuse_lowlevel_ops), fs.get());
  fuse_opt_free_args(&args);
  if (se == nullptr) return Status::InvalidArgument("libfuse rejected the options: " + fuse_opts);
  fs->set_session(se);
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_destroy(se);
    return Status::Internal("fuse_set_signal_handlers failed");
  }
  if (fuse_session_mount(se, mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return Status::Io(EIO, "mount " + mountpoint + " failed (see the message above)");
  }
  // The parent returns once the mount exists (requests wait for the loop).
  if (fuse_daemonize(options.foreground ? 1 : 0) != 0) {
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    return Status::Internal("fuse_daemonize failed");
  }
  // Detached without log=: stderr is /dev/null now, syslog takes the lines.
  if (!options.foreground && options.log_file.empty()) log.UseSyslog();
  fs->StartWorkers();
  std::thread readahead([&] { RaiseReadAhead(mountpoint, options.read_ahead_kb, &log); });
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, options.fuse_threads);
  fuse_loop_cfg_set_clone_fd(cfg, 0);
  int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);
  readahead.join();
  log.Info("session loop ended (rc={}); finishing pending commits", rc);
  fs->StopWorkers();
  fs.reset();  // closes every inode (and its staging files) first
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  log.Info("ckptfs exited cleanly");
  return Status::Ok();
}

}  // namespace ckptfs::fs
