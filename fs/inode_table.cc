#include "fs/inode.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ckptfs::fs {

std::string_view FilePhaseName(FilePhase phase) {
  switch (phase) {
    case FilePhase::kUnloaded: return "unloaded";
    case FilePhase::kPlain: return "plain";
    case FilePhase::kCommitted: return "committed";
    case FilePhase::kStaging: return "staging";
    case FilePhase::kEncoding: return "encoding";
  }
  return "unknown";
}

Inode::~Inode() {
  if (file.manifest_fd >= 0) ::close(file.manifest_fd);
  // A staging file of an unlinked (or never committed) file goes with it,
  // unless a durable manifest names it (StagingFile's destructor decides).
  ::close(fd);
}

InodeTable::InodeTable(int root_fd) {
  struct stat st {};
  ::fstatat(root_fd, "", &st, AT_EMPTY_PATH);
  root_ = std::make_shared<Inode>(FUSE_ROOT_ID, 0, st.st_dev, st.st_ino, S_IFDIR, root_fd);
  root_->nlookup = 1;
  inodes_[FUSE_ROOT_ID] = root_;
}

std::shared_ptr<Inode> InodeTable::Get(fuse_ino_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  return it == inodes_.end() ? nullptr : it->second;
}

std::shared_ptr<Inode> InodeTable::FindOrInsert(int path_fd, const struct stat& st) {
  std::lock_guard<std::mutex> lock(mu_);
  if (st.st_dev == root_->dev && st.st_ino == root_->backing_ino) {
    ::close(path_fd);
    ++root_->nlookup;
    return root_;
  }
  fuse_ino_t ino = static_cast<fuse_ino_t>(st.st_ino);
  auto it = inodes_.find(ino);
  if (it != inodes_.end()) {
    ::close(path_fd);
    if (it->second->dev != st.st_dev) return nullptr;
    ++it->second->nlookup;
    return it->second;
  }
  if (ino == FUSE_ROOT_ID) {
    ::close(path_fd);
    return nullptr;
  }
  auto inode = std::make_shared<Inode>(ino, next_generation_++, st.st_dev, st.st_ino, st.st_mode & S_IFMT, path_fd);
  inode->nlookup = 1;
  inodes_[ino] = inode;
  return inode;
}

std::shared_ptr<Inode> InodeTable::FindByBacking(dev_t dev, ino_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(static_cast<fuse_ino_t>(ino));
  if (it == inodes_.end() || it->second->dev != dev) return nullptr;
  return it->second;
}

bool InodeTable::IdleLocked(Inode& inode) {
  std::lock_guard<std::mutex> lock(inode.mu);
  FileState& f = inode.file;
  if (f.phase != FilePhase::kStaging && f.phase != FilePhase::kEncoding) return true;
  // A file that no name reaches any more and no writer holds, left in
  // STAGING because its commit failed (e.g. ENOSPC) or was never queued:
  // nothing will commit it, so it and its staging files go now, which is
  // what gives the space of a deleted file back on a full backing store.
  struct stat st;
  if (f.phase == FilePhase::kStaging && f.writers == 0 && ::fstatat(inode.fd, "", &st, AT_EMPTY_PATH) == 0 &&
      st.st_nlink == 0) {
    if (f.staging) f.staging->set_keep(false);
    for (auto& old : f.superseded) old->set_keep(false);
    return true;
  }
  return false;
}

void InodeTable::Forget(fuse_ino_t ino, uint64_t n) {
  std::shared_ptr<Inode> doomed;  // destroyed after mu_ is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end() || ino == FUSE_ROOT_ID) return;
  Inode& inode = *it->second;
  inode.nlookup = n >= inode.nlookup ? 0 : inode.nlookup - n;
  if (inode.nlookup == 0 && IdleLocked(inode)) {
    doomed = std::move(it->second);
    inodes_.erase(it);
  }
}

void InodeTable::EraseIfUnused(fuse_ino_t ino) { Forget(ino, 0); }

std::vector<std::shared_ptr<Inode>> InodeTable::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Inode>> all;
  all.reserve(inodes_.size());
  for (auto& [ino, inode] : inodes_) all.push_back(inode);
  return all;
}

}  // namespace ckptfs::fs
