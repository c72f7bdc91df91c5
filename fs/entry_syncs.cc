#include "fs/entry_syncs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace ckptfs::fs {

uint64_t EntrySyncs::EntryMade() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ticket_++;
}

void EntrySyncs::FolderMade(dev_t dev, ino_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  new_folders_[{dev, ino}] = next_ticket_++;
}

void EntrySyncs::FolderMoved(dev_t dev, ino_t ino) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = new_folders_.find({dev, ino});
  if (it != new_folders_.end()) it->second = next_ticket_++;
}

uint64_t EntrySyncs::folder_fsyncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return folder_fsyncs_;
}

Status EntrySyncs::SyncOne(const std::string& folder, uint64_t ticket, FolderId* id) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, "open dir " + folder);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Io(err, "fstat dir " + folder);
  }
  *id = {st.st_dev, st.st_ino};
  uint64_t started_at;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = covered_below_.find(*id);
    if (it != covered_below_.end() && ticket < it->second) {
      ::close(fd);
      return Status::Ok();
    }
    // Every entry made before this point is in the folder when the fsync
    // starts, and durable when it returns.
    started_at = next_ticket_;
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::Io(err, "fsync dir " + folder);
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& covered = covered_below_[*id];
  covered = std::max(covered, started_at);
  ++folder_fsyncs_;
  return Status::Ok();
}

Status EntrySyncs::Sync(std::string folder, uint64_t ticket) {
  FolderId id;
  RETURN_IF_ERROR(SyncOne(folder, ticket, &id));  // the entry in `folder`
  // While `folder` was itself made through the mount and its entry is not
  // known durable: that entry, in the folder above.
  for (;;) {
    uint64_t own;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = new_folders_.find(id);
      if (it == new_folders_.end()) return Status::Ok();
      own = it->second;
    }
    const size_t slash = folder.rfind('/');
    if (slash == std::string::npos || slash == 0) return Status::Ok();
    folder.resize(slash);
    FolderId parent;
    RETURN_IF_ERROR(SyncOne(folder, own, &parent));
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = new_folders_.find(id);
      if (it != new_folders_.end() && it->second == own) new_folders_.erase(it);  // not moved meanwhile
    }
    id = parent;
  }
}

}  // namespace ckptfs::fs
