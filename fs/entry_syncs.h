// The folder fsyncs that make new entries durable (DESIGN.md §3: objects,
// then manifest, then directory). A file or folder created through the
// mount has an entry in its backing folder that a crash of the machine may
// lose until that folder is fsynced; a file's first durable record is
// therefore followed by an fsync of its folder, and, while that folder was
// itself made through the mount and not yet synced in its parent, of the
// parent too, and so on up. One fsync covers every entry made in that
// folder before it started, so an entry that an fsync which started after
// it was made already covered needs none: a save of many files into one
// folder pays about one fsync per commit round, not one per file (1000
// new 16 KiB files into a new folder: one fsync each cost a fifth of the
// time until committed; grouped, 8 fsyncs of the folder and 1 of its
// parent, and no measurable cost). SyncOne opens and fsyncs like SyncDir
// (store.h) but also needs the folder's identity from the same descriptor.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "codec/common/status.h"

namespace ckptfs::fs {

// Thread safety: all methods are thread-safe.
class EntrySyncs {
 public:
  // A ticket for an entry made now (after it exists on the backing disk).
  uint64_t EntryMade();
  // A folder made through the mount (dev, ino of the backing folder): its
  // entry in its parent is new until a Sync of a file below it syncs it.
  void FolderMade(dev_t dev, ino_t ino);
  // The folder was renamed: its entry in the new parent is new.
  void FolderMoved(dev_t dev, ino_t ino);
  // Makes the entry of `ticket` in the folder at `folder` (a path) durable,
  // and the entries of the new folders above it: fsyncs each folder unless
  // an fsync of it that started after the entry was made has finished.
  Status Sync(std::string folder, uint64_t ticket);
  // Folder fsyncs done since construction.
  uint64_t folder_fsyncs() const;

 private:
  using FolderId = std::pair<dev_t, ino_t>;
  Status SyncOne(const std::string& folder, uint64_t ticket, FolderId* id);

  mutable std::mutex mu_;
  uint64_t next_ticket_ = 1;
  // Per folder: every entry in it with a ticket below this is durable.
  std::map<FolderId, uint64_t> covered_below_;
  // Folders made (or moved) through the mount whose own entry is not yet
  // known durable, with its ticket.
  std::map<FolderId, uint64_t> new_folders_;
  uint64_t folder_fsyncs_ = 0;
};

}  // namespace ckptfs::fs
