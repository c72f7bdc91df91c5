#include "fs/entry_syncs.h"

#include <algorithm>

#include "fs/store.h"

namespace ckptfs::fs {

uint64_t EntrySyncs::EntryMade() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ticket_++;
}

Status EntrySyncs::Sync(const std::string& folder, uint64_t ticket) {
  uint64_t started_at;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = covered_below_.find(folder);
    if (it != covered_below_.end() && ticket < it->second) return Status::Ok();
    // Every entry made before this point is in the folder when the fsync
    // starts, and durable when it returns.
    started_at = next_ticket_;
  }
  RETURN_IF_ERROR(SyncDir(folder));
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& covered = covered_below_[folder];
  covered = std::max(covered, started_at);
  return Status::Ok();
}

}  // namespace ckptfs::fs
