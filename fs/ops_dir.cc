// Namespace operations: lookup/forget, mkdir/mknod/symlink/link, unlink,
// rmdir, rename, readlink, readdir, statfs.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>  // RENAME_EXCHANGE
#include <cstring>

#include "fs/filesystem.h"

namespace ckptfs::fs {

void Filesystem::Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto dir = inodes_.Get(parent);
  if (!dir) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(parent, name)) return (void)fuse_reply_err(req, ENOENT);
  fuse_entry_param e;
  Status s = DoLookup(*dir, name, &e);
  if (!s.ok()) {
    if (s.sys_errno() == ENOENT) {  // negative entry, cached briefly
      std::memset(&e, 0, sizeof e);
      e.entry_timeout = cache_timeout_;
      return (void)fuse_reply_entry(req, &e);
    }
    return (void)fuse_reply_err(req, ToErrno(s));
  }
  fuse_reply_entry(req, &e);
}

void Filesystem::Forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  inodes_.Forget(ino, nlookup);
  fuse_reply_none(req);
}

void Filesystem::ForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) inodes_.Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void Filesystem::MkDir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  auto dir = inodes_.Get(parent);
  if (!dir) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  if (::mkdirat(dir->fd, name, mode) != 0) return (void)fuse_reply_err(req, errno);
  if (Status set = SetUpNewEntry(req, dir->fd, name, mode); !set.ok()) {
    ::unlinkat(dir->fd, name, AT_REMOVEDIR);
    return (void)fuse_reply_err(req, ToErrno(set));
  }
  fuse_entry_param e;
  Status s = DoLookup(*dir, name, &e);
  if (!s.ok()) return (void)fuse_reply_err(req, ToErrno(s));
  struct stat made;  // the backing folder's identity (EntrySyncs keys folders by it)
  if (::fstatat(dir->fd, name, &made, AT_SYMLINK_NOFOLLOW) == 0)
    entry_syncs_.FolderMade(made.st_dev, made.st_ino);  // synced with its first file's commit
  fuse_reply_entry(req, &e);
}

void Filesystem::MkNod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  auto dir = inodes_.Get(parent);
  if (!dir) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  if (S_ISREG(mode)) {  // an empty regular file: an empty manifest
    int fd = ::openat(dir->fd, name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, mode & 07777);
    if (fd < 0) return (void)fuse_reply_err(req, errno);
    Status init = InitEmptyManifest(fd, false);
    ::close(fd);
    if (!init.ok()) {
      ::unlinkat(dir->fd, name, 0);
      return (void)fuse_reply_err(req, ToErrno(init));
    }
  } else if (::mknodat(dir->fd, name, mode, rdev) != 0) {
    return (void)fuse_reply_err(req, errno);
  }
  if (Status set = SetUpNewEntry(req, dir->fd, name, mode); !set.ok()) {
    ::unlinkat(dir->fd, name, 0);
    return (void)fuse_reply_err(req, ToErrno(set));
  }
  fuse_entry_param e;
  Status s = DoLookup(*dir, name, &e);
  if (!s.ok()) return (void)fuse_reply_err(req, ToErrno(s));
  if (S_ISREG(mode)) {
    if (auto inode = inodes_.Get(e.ino)) {
      std::lock_guard<std::mutex> lock(inode->mu);
      inode->file.entry_ticket = entry_syncs_.EntryMade();  // SyncEntryLocked
    }
  }
  fuse_reply_entry(req, &e);
}

void Filesystem::Symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  auto dir = inodes_.Get(parent);
  if (!dir) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  if (::symlinkat(link, dir->fd, name) != 0) return (void)fuse_reply_err(req, errno);
  if (Status set = SetUpNewEntry(req, dir->fd, name, 0777); !set.ok()) {
    ::unlinkat(dir->fd, name, 0);
    return (void)fuse_reply_err(req, ToErrno(set));
  }
  fuse_entry_param e;
  Status s = DoLookup(*dir, name, &e);
  if (!s.ok()) return (void)fuse_reply_err(req, ToErrno(s));
  fuse_reply_entry(req, &e);
}

void Filesystem::Link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  auto inode = inodes_.Get(ino);
  auto dir = inodes_.Get(newparent);
  if (!inode || !dir) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(newparent, newname)) return (void)fuse_reply_err(req, EEXIST);
  // AT_EMPTY_PATH links the O_PATH fd itself (the daemon runs as root).
  if (::linkat(inode->fd, "", dir->fd, newname, AT_EMPTY_PATH) != 0) {
    if (errno != ENOENT && errno != EPERM) return (void)fuse_reply_err(req, errno);
    if (::linkat(AT_FDCWD, inode->ProcPath().c_str(), dir->fd, newname, AT_SYMLINK_FOLLOW) != 0)
      return (void)fuse_reply_err(req, errno);
  }
  fuse_entry_param e;
  Status s = DoLookup(*dir, newname, &e);
  if (!s.ok()) return (void)fuse_reply_err(req, ToErrno(s));
  fuse_reply_entry(req, &e);
}

void Filesystem::Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto dir = inodes_.Get(parent);
  if (!dir) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(parent, name)) return (void)fuse_reply_err(req, EPERM);
  // Open handles keep reading: the inode holds the file's O_PATH fd and its
  // staging file or object reader.
  const bool removed = ::unlinkat(dir->fd, name, 0) == 0;
  const int err = removed ? 0 : errno;
  std::string rel;
  if (removed) rel = parent == FUSE_ROOT_ID ? std::string(name) : RelativePath(*dir) + "/" + name;
  fuse_reply_err(req, err);
  if (removed && rel.front() != '/') NoteDeleted(rel);
}

void Filesystem::RmDir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto dir = inodes_.Get(parent);
  if (!dir) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(parent, name)) return (void)fuse_reply_err(req, EPERM);
  fuse_reply_err(req, ::unlinkat(dir->fd, name, AT_REMOVEDIR) != 0 ? errno : 0);
}

void Filesystem::Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                        const char* newname, unsigned int flags) {
  auto from = inodes_.Get(parent);
  auto to = inodes_.Get(newparent);
  if (!from || !to) return (void)fuse_reply_err(req, ESTALE);
  if (IsHidden(parent, name) || IsHidden(newparent, newname)) return (void)fuse_reply_err(req, EPERM);
  // Manifests move with their names; a replaced target that is still open
  // keeps its content through its inode (like unlink).
  if (::renameat2(from->fd, name, to->fd, newname, flags) != 0) return (void)fuse_reply_err(req, errno);
  // The moved entries (both with RENAME_EXCHANGE). One whose entry was not
  // yet durable (made through the mount) is new in its new folder too: a
  // new ticket, so that an fsync of that folder made earlier does not count.
  auto moved_to = [&](const Inode& dir, const char* entry) {
    struct stat st;
    if (::fstatat(dir.fd, entry, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
    if (S_ISDIR(st.st_mode)) return entry_syncs_.FolderMoved(st.st_dev, st.st_ino);
    if (!S_ISREG(st.st_mode)) return;
    if (auto moved = inodes_.FindByBacking(st.st_dev, st.st_ino)) {
      std::lock_guard<std::mutex> lock(moved->mu);
      moved->file.parent_dir = dir.backing_ino;
      if (moved->file.entry_ticket != 0) moved->file.entry_ticket = entry_syncs_.EntryMade();
    }
  };
  moved_to(*to, newname);
  if (flags & RENAME_EXCHANGE) moved_to(*from, name);
  fuse_reply_err(req, 0);
}

void Filesystem::ReadLink(fuse_req_t req, fuse_ino_t ino) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  char buf[PATH_MAX + 1];
  ssize_t n = ::readlinkat(inode->fd, "", buf, sizeof buf - 1);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  buf[n] = '\0';
  fuse_reply_readlink(req, buf);
}

void Filesystem::OpenDir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto inode = inodes_.Get(ino);
  if (!inode) return (void)fuse_reply_err(req, ESTALE);
  int fd = ::openat(inode->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return (void)fuse_reply_err(req, errno);
  auto handle = std::make_unique<DirHandle>();
  handle->dir = ::fdopendir(fd);
  if (handle->dir == nullptr) {
    int err = errno;
    ::close(fd);
    return (void)fuse_reply_err(req, err);
  }
  fi->fh = reinterpret_cast<uint64_t>(handle.get());
  if (fuse_reply_open(req, fi) == 0) handle.release();
}

void Filesystem::ReadDir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  ReadDirCommon(req, ino, size, off, fi, /*plus=*/false);
}

void Filesystem::ReadDirPlus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  ReadDirCommon(req, ino, size, off, fi, /*plus=*/true);
}

void Filesystem::ReadDirCommon(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi,
                               bool plus) {
  auto* handle = reinterpret_cast<DirHandle*>(fi->fh);
  auto dir_inode = inodes_.Get(ino);
  if (!dir_inode) return (void)fuse_reply_err(req, ESTALE);
  std::vector<char> buf(size);
  size_t used = 0;
  ::seekdir(handle->dir, off);
  for (;;) {
    long here = ::telldir(handle->dir);
    errno = 0;
    struct dirent* d = ::readdir(handle->dir);
    if (d == nullptr) {
      if (errno != 0 && used == 0) return (void)fuse_reply_err(req, errno);
      break;
    }
    if (ino == FUSE_ROOT_ID && std::strcmp(d->d_name, kMetaDirName) == 0) continue;
    struct stat st {};
    st.st_ino = d->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(d->d_type));
    off_t next = ::telldir(handle->dir);
    if (!plus) {
      size_t n = fuse_add_direntry(req, buf.data() + used, size - used, d->d_name, &st, next);
      if (n > size - used) {
        ::seekdir(handle->dir, here);
        break;
      }
      used += n;
      continue;
    }
    // readdirplus: each entry returned with a nonzero ino counts a lookup.
    fuse_entry_param e;
    std::memset(&e, 0, sizeof e);
    bool dot = std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0;
    if (dot) {
      e.attr = st;
    } else if (!DoLookup(*dir_inode, d->d_name, &e).ok()) {
      continue;  // vanished meanwhile
    }
    size_t n = fuse_add_direntry_plus(req, buf.data() + used, size - used, d->d_name, &e, next);
    if (n > size - used) {
      if (e.ino != 0) inodes_.Forget(e.ino, 1);
      ::seekdir(handle->dir, here);
      break;
    }
    used += n;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void Filesystem::ReleaseDir(fuse_req_t req, fuse_ino_t /*ino*/, fuse_file_info* fi) {
  delete reinterpret_cast<DirHandle*>(fi->fh);
  fuse_reply_err(req, 0);
}

void Filesystem::FsyncDir(fuse_req_t req, fuse_ino_t /*ino*/, int datasync, fuse_file_info* fi) {
  int fd = ::dirfd(reinterpret_cast<DirHandle*>(fi->fh)->dir);
  int rc = datasync ? ::fdatasync(fd) : ::fsync(fd);
  fuse_reply_err(req, rc != 0 ? errno : 0);
}

void Filesystem::StatFs(fuse_req_t req, fuse_ino_t /*ino*/) {
  // Someone asking how much space is free: let go of objects a GC removed,
  // whose space our cached readers would otherwise keep allocated.
  store_->DropRemovedObjects();
  struct statvfs sv;
  if (::fstatvfs(store_->backing_fd(), &sv) != 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_statfs(req, &sv);
}

}  // namespace ckptfs::fs
