// The folder fsyncs that make new files' entries durable (DESIGN.md §3:
// objects, then manifest, then directory). A file created through the mount
// has an entry in its backing folder that a crash of the machine may lose
// until that folder is fsynced; its first durable record is therefore
// followed by a folder fsync. One fsync covers every entry made in that
// folder before it started, so a file whose entry an fsync that started
// after its creation already covered needs none: a save of many files
// into one folder pays about one fsync per commit round, not one per file
// (1000 new 16 KiB files: one fsync each cost a fifth of the time until
// committed).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "codec/common/status.h"

namespace ckptfs::fs {

// Thread safety: all methods are thread-safe.
class EntrySyncs {
 public:
  // A ticket for an entry made now (after it exists on the backing disk).
  uint64_t EntryMade();
  // Makes the entry of `ticket` in `folder` (a path) durable: fsyncs the
  // folder unless an fsync of it that started after the entry was made has
  // finished.
  Status Sync(const std::string& folder, uint64_t ticket);

 private:
  mutable std::mutex mu_;
  uint64_t next_ticket_ = 1;
  // Per folder: every entry with a ticket below this is durable.
  std::unordered_map<std::string, uint64_t> covered_below_;
};

}  // namespace ckptfs::fs
