// getattr/setattr and extended attributes. user.* attributes live on the
// manifest file itself; user.ckptfs.* are read-only virtual attributes.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fs/filesystem.h"

#include "codec/container/lossy_report.h"
#include "fs/reconstruction_spill.h"

namespace ckptfs::fs {
namespace {
constexpr std::string_view kVirtualPrefix = "user.ckptfs.";
bool IsVirtual(std::string_view name) { return name.starts_with(kVirtualPrefix); }
bool IsUser(std::string_view name) { return name.starts_with("user."); }

void ReplyXattrValue(fuse_req_t req, const std::string& value, size_t size) {
  if (size == 0) return (void)fuse_reply_xattr(req, value.size());
  if (value.size() > size) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, value.data(), value.size());
}
}  // namespace

void Filesystem::GetAttr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* /*fi*/) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  auto st = StatInode(*inode);
  if (!st.ok()) return (void)fuse_reply_err(req, ToErrno(st.status()));
  fuse_reply_attr(req, &*st, cache_timeout_);
}

void Filesystem::SetAttr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* /*fi*/) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  bool symlink = S_ISLNK(inode->type);
  std::string proc = inode->ProcPath();
  if ((to_set & FUSE_SET_ATTR_MODE) && !symlink && ::chmod(proc.c_str(), attr->st_mode & 07777) != 0)
    return (void)fuse_reply_err(req, errno);
  if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
    uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : static_cast<uid_t>(-1);
    gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : static_cast<gid_t>(-1);
    if (::fchownat(inode->fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0)
      return (void)fuse_reply_err(req, errno);
  }
  if (to_set & FUSE_SET_ATTR_SIZE) {
    if (!inode->is_reg()) return (void)fuse_reply_err(req, inode->is_dir() ? EISDIR : EINVAL);
    ClearSetIdForCaller(req, *inode);
    Status s;
    {
      std::unique_lock<std::mutex> lock(inode->mu);
      AwaitKernelCopyLocked(lock, *inode, true);  // the size changes under the kernel's cache
      FileState& f = inode->file;
      s = LoadLocked(*inode);
      uint64_t size = 0;
      if (s.ok()) {
        auto current = SizeLocked(*inode);
        if (!current.ok()) s = current.status();
        else size = *current;
      }
      bool in_staging = f.phase == FilePhase::kStaging || f.phase == FilePhase::kEncoding;
      if (s.ok() && (in_staging || size != static_cast<uint64_t>(attr->st_size))) {
        s = EnsureStagingLocked(*inode, attr->st_size == 0);
        if (s.ok()) {
          if (::ftruncate(f.staging->fd(), attr->st_size) != 0) s = Status::Io(errno, "truncate staging");
          if (s.ok()) f.staging->digest().Truncated(static_cast<uint64_t>(attr->st_size));
          else f.staging->digest().Invalidate();
        }
        if (s.ok()) {
          f.MarkChanged(/*touch_times=*/true);
          f.cached_gen = f.content_gen;
          MaybeQueueCommitLocked(inode);  // truncate(2) without an open writer commits now
        }
      }
    }
    if (!s.ok()) return (void)fuse_reply_err(req, ToErrno(s));
  }
  if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
    struct timespec tv[2];
    tv[0].tv_nsec = tv[1].tv_nsec = UTIME_OMIT;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) tv[0].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_ATIME) tv[0] = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) tv[1].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_MTIME) tv[1] = attr->st_mtim;
    // On the O_PATH fd itself, so that a symlink's own times change
    // (utimensat with AT_SYMLINK_NOFOLLOW), not its target's.
    std::lock_guard<std::mutex> lock(inode->mu);
    if (::utimensat(inode->fd, "", tv, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0)
      return (void)fuse_reply_err(req, errno);
    if (to_set & FUSE_SET_ATTR_MTIME) {
      // The user's mtime wins. A commit rewrites the manifest, whose mtime
      // is the file's: for a staged file it is put back after the commit.
      FileState& f = inode->file;
      struct stat st;
      bool staged = f.phase == FilePhase::kStaging || f.phase == FilePhase::kEncoding;
      if (staged && ::fstatat(inode->fd, "", &st, AT_EMPTY_PATH) == 0) f.pending_mtime = st.st_mtim;
      else f.pending_mtime.reset();
    }
  }
  GetAttr(req, ino, nullptr);
}

Result<std::string> Filesystem::VirtualXattrLocked(Inode& inode, std::string_view name) {
  std::string_view key = name.substr(kVirtualPrefix.size());
  if (inode.ino == FUSE_ROOT_ID) {
    if (key == "pending")
      return std::to_string((queue_ ? queue_->pending() : 0) + closing_handles_.load() + fsync_commits_.load());
    if (key == "pid") return std::to_string(::getpid());
    // Chunks this daemon has decoded for reads and encodes since it started.
    if (key == "decoded_chunks") return std::to_string(store_->chunk_cache()->decodes());
    // Reconstructions kept for the next versions, in memory or in the
    // staging area (fs/reconstruction_spill.h), kept in the background
    // after commits.
    if (key == "spilled") {
      const ReconstructionSpill* spill = store_->reconstruction_spill();
      return std::to_string(spill != nullptr ? spill->count() : 0);
    }
    if (key == "level") return options_.level;  // the preset the mount's options started from
    // Commits whose content digests were hashed as the bytes were written,
    // and those that hashed the staged file instead (fs/staged_digest.h).
    if (key == "digests_from_writes") return std::to_string(digests_from_writes_.load());
    if (key == "digests_hashed_at_commit") return std::to_string(digests_hashed_at_commit_.load());
  }
  if (!inode.is_reg()) return Status::Io(ENODATA, "no such attribute");
  RETURN_IF_ERROR(LoadLocked(inode));
  FileState& f = inode.file;
  const Manifest& m = f.manifest;
  bool committed = f.phase == FilePhase::kCommitted;
  ASSIGN_OR_RETURN(uint64_t size, SizeLocked(inode));
  uint64_t stored = size;
  if (committed) stored = m.kind == ManifestKind::kInline ? m.inline_data.size() : m.stored_bytes;
  if (key == "state") return std::string(FilePhaseName(f.phase));
  if (key == "stored_bytes") return std::to_string(stored);
  if (key == "logical_bytes") return std::to_string(size);
  if (key == "ratio") return fmt::format("{:.3f}", stored == 0 ? 1.0 : static_cast<double>(size) / stored);
  // Largest per-tensor rel_l2 of the committed blob (nullopt: lossless).
  auto max_error = [&]() -> Result<std::optional<double>> {
    if (!committed || m.kind != ManifestKind::kBlob) return std::optional<double>();
    ASSIGN_OR_RETURN(auto reader, store_->OpenBlob(m.object));
    return MaxLossyRelL2(*reader);
  };
  if (key == "codec") {
    if (!committed) return std::string(FilePhaseName(f.phase));
    if (m.kind == ManifestKind::kBlob) {
      ASSIGN_OR_RETURN(std::optional<double> error, max_error());
      return fmt::format("blob:{}{}", FileFormatName(m.format), error ? "+lossy" : "");
    }
    return std::string(StorageName(m));
  }
  if (key == "error") {
    ASSIGN_OR_RETURN(std::optional<double> error, max_error());
    return error ? fmt::format("{:.6g}", *error) : std::string("lossless");
  }
  if (key == "base") return committed && m.base ? m.base->Hex() : std::string();
  if (key == "object") {
    bool has = committed && (m.kind == ManifestKind::kBlob || m.kind == ManifestKind::kRaw);
    return has ? m.object.Hex() : std::string();
  }
  if (key == "chain_depth") return std::to_string(committed ? m.chain_depth : 0);
  if (key == "level") {
    // The level the committed version was stored under ("unknown" when
    // none was recorded); a file being written has none yet.
    if (!committed) return std::string(FilePhaseName(f.phase));
    int fd = OpenNoAtime(AT_FDCWD, inode.ProcPath().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::Io(errno, "open manifest");
    std::string level = RecordedLevel(fd);
    ::close(fd);
    return level.empty() ? std::string("unknown") : level;
  }
  return Status::Io(ENODATA, "no such attribute");
}

void Filesystem::GetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  if (IsVirtual(name)) {
    Result<std::string> value = Status::Internal("unset");
    {
      std::lock_guard<std::mutex> lock(inode->mu);
      value = VirtualXattrLocked(*inode, name);
    }
    if (!value.ok()) return (void)fuse_reply_err(req, ToErrno(value.status()));
    return ReplyXattrValue(req, *value, size);
  }
  if (!IsUser(name) || S_ISLNK(inode->type)) return (void)fuse_reply_err(req, ENODATA);
  std::string value(size, '\0');
  ssize_t n = ::getxattr(inode->ProcPath().c_str(), name, size ? value.data() : nullptr, size);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  if (size == 0) return (void)fuse_reply_xattr(req, static_cast<size_t>(n));
  fuse_reply_buf(req, value.data(), static_cast<size_t>(n));
}

void Filesystem::SetXattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                          int flags) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  if (IsVirtual(name)) {
    // user.ckptfs.sync on the root: a sync or an unmount waits for every
    // commit; commits that wait for something (a DCP shard for its
    // .metadata) go ahead now.
    if (ino == FUSE_ROOT_ID && std::string_view(name) == "user.ckptfs.sync") {
      if (queue_) queue_->Hurry();
      return (void)fuse_reply_err(req, 0);
    }
    return (void)fuse_reply_err(req, EPERM);
  }
  if (!IsUser(name)) return (void)fuse_reply_err(req, EOPNOTSUPP);
  if (S_ISLNK(inode->type)) return (void)fuse_reply_err(req, EPERM);
  int rc = ::setxattr(inode->ProcPath().c_str(), name, value, size, flags);
  fuse_reply_err(req, rc != 0 ? errno : 0);
}

void Filesystem::ListXattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  std::string names;
  if (!S_ISLNK(inode->type)) {
    std::string raw(64 * 1024, '\0');
    ssize_t n = ::listxattr(inode->ProcPath().c_str(), raw.data(), raw.size());
    if (n < 0) return (void)fuse_reply_err(req, errno);
    // Only user.* is the user's; the virtual user.ckptfs.* names are not
    // listed, so copy tools do not try to set them on another file.
    for (size_t at = 0; at < static_cast<size_t>(n);) {
      std::string_view one(raw.data() + at);
      if (IsUser(one) && !IsVirtual(one)) names.append(one).push_back('\0');
      at += one.size() + 1;
    }
  }
  if (size == 0) return (void)fuse_reply_xattr(req, names.size());
  if (names.size() > size) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, names.data(), names.size());
}

void Filesystem::RemoveXattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  if (IsVirtual(name)) return (void)fuse_reply_err(req, EPERM);
  if (!IsUser(name) || S_ISLNK(inode->type)) return (void)fuse_reply_err(req, ENODATA);
  int rc = ::removexattr(inode->ProcPath().c_str(), name);
  fuse_reply_err(req, rc != 0 ? errno : 0);
}

}  // namespace ckptfs::fs
