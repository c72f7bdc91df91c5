#include "fs/folder_commits.h"

namespace ckptfs::fs {

FolderCommits::Entry FolderCommits::Enter(ino_t dir) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t ticket = next_++;
  running_[dir].insert(ticket);
  return Entry(*this, dir, ticket);
}

bool FolderCommits::WaitForEarlier(const Entry& entry, std::chrono::milliseconds timeout,
                                   const std::function<bool()>& give_up) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  bool waited = false;
  for (;;) {
    const auto here = running_.find(entry.dir());
    if (here == running_.end() || *here->second.begin() >= entry.ticket()) return waited;
    if (std::chrono::steady_clock::now() >= deadline) return waited;
    lock.unlock();
    const bool stop = give_up && give_up();
    lock.lock();
    if (stop) return waited;
    waited = true;
    left_.wait_for(lock, std::chrono::milliseconds(50));
  }
}

void FolderCommits::Leave(ino_t dir, uint64_t ticket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = running_.find(dir);
    if (it != running_.end()) {
      it->second.erase(ticket);
      if (it->second.empty()) running_.erase(it);
    }
  }
  left_.notify_all();
}

}  // namespace ckptfs::fs
