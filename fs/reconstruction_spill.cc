#include "fs/reconstruction_spill.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

namespace ckptfs::fs {

uint64_t ReconstructionSpill::DefaultCapacity(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0 || fs.f_type == TMPFS_MAGIC) return 0;
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0) return 0;
  const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  return std::min(kMaxDefaultBytes, free_bytes / 4);
}

namespace {

// The default SpaceProbe: statvfs of the spill's directory.
std::optional<ReconstructionSpill::Space> StatvfsSpace(const std::string& dir) {
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0) return std::nullopt;
  return ReconstructionSpill::Space{uint64_t{vfs.f_blocks} * vfs.f_frsize, uint64_t{vfs.f_bavail} * vfs.f_frsize};
}

}  // namespace

ReconstructionSpill::ReconstructionSpill(std::string dir, uint64_t capacity_bytes, SpaceProbe probe,
                                         uint64_t memory_bytes)
    : dir_(std::move(dir)),
      capacity_(capacity_bytes),
      probe_(probe ? std::move(probe) : [d = dir_] { return StatvfsSpace(d); }),
      memory_capacity_(memory_bytes) {}

ReconstructionSpill::~ReconstructionSpill() = default;

Result<int> ReconstructionSpill::OpenUnnamed() {
  int fd = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
    return Status::Io(errno, "open an unnamed file in " + dir_);
  // A filesystem without O_TMPFILE: a file unlinked as soon as it exists.
  std::string path = dir_ + "/.reconstruction-XXXXXX";
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, "create a file in " + dir_);
  ::unlink(name.data());
  return fd;
}

bool ReconstructionSpill::MakeRoom(uint64_t size) {
  for (;;) {
    const std::optional<Space> space = probe_();
    if (!space) return false;
    const uint64_t total = space->total, free_bytes = space->available;
    const uint64_t keep_free = std::max<uint64_t>(static_cast<uint64_t>(kFreeShare * static_cast<double>(total)),
                                                  uint64_t{1} << 30);
    if (free_bytes >= size && free_bytes - size >= keep_free) return true;
    // Dropping the least recently used gives its space back once no
    // reader holds it (a read in flight delays that a moment).
    std::vector<std::shared_ptr<const void>> released;  // freed after the lock is released
    std::lock_guard lock(mu_);
    if (lru_.empty()) return false;
    RemoveLocked(std::prev(lru_.end()), &released);
  }
}

Result<ReconstructionSpill::Pending> ReconstructionSpill::Write(ByteSpan reconstruction) {
  if (reconstruction.empty() || reconstruction.size() > capacity_ || !MakeRoom(reconstruction.size()))
    return Pending();
  ASSIGN_OR_RETURN(int fd, OpenUnnamed());
  ASSIGN_OR_RETURN(std::unique_ptr<DirectFile> file,
                   DirectFile::Write(fd, reconstruction, "a reconstruction in " + dir_, windows_));
  return Pending(std::move(file));
}

void ReconstructionSpill::RemoveLocked(std::list<Entry>::iterator it,
                                       std::vector<std::shared_ptr<const void>>* released) {
  if (it->file) bytes_ -= it->file->Size();
  in_memory_ -= it->memory.size();
  released->push_back(std::move(it->file));
  released->push_back(std::move(it->owner));
  map_.erase(it->blob);
  lru_.erase(it);
}

void ReconstructionSpill::InsertLocked(const ObjectId& blob, const ObjectId* replaces, Entry entry,
                                       std::vector<std::shared_ptr<const void>>* released) {
  for (const ObjectId* id : {&blob, replaces}) {
    if (id == nullptr) continue;
    auto it = map_.find(*id);
    if (it == map_.end()) continue;
    RemoveLocked(it->second, released);
  }
  const uint64_t file_bytes = entry.file ? entry.file->Size() : 0;
  auto over = [&] { return bytes_ + file_bytes > capacity_ || map_.size() >= kMaxEntries; };
  for (auto it = lru_.end(); over() && it != lru_.begin();) {
    auto victim = std::prev(it);
    if (!victim->file && map_.size() < kMaxEntries) {  // in memory only: not on the disk's bound
      it = victim;
      continue;
    }
    RemoveLocked(victim, released);  // `it` stays valid
  }
  bytes_ += file_bytes;
  in_memory_ += entry.memory.size();
  lru_.push_front(std::move(entry));
  map_.emplace(blob, lru_.begin());
}

void ReconstructionSpill::Keep(const ObjectId& blob, Pending pending, const ObjectId* replaces) {
  if (pending.empty()) return;
  std::vector<std::shared_ptr<const void>> released;  // freed after the lock is released
  std::lock_guard lock(mu_);
  InsertLocked(blob, replaces, Entry{blob, std::move(pending.file_), {}, nullptr}, &released);
}

void ReconstructionSpill::KeepReconstruction(const ObjectId& blob, ByteSpan memory, std::shared_ptr<const void> owner,
                                             const ObjectId* replaces, const ObjectId* demotes,
                                             const std::function<void(const Status&)>& on_error) {
  if (memory.empty()) return;
  if (memory.size() > memory_capacity_) {  // straight to a file
    Result<Pending> written = Write(memory);
    if (!written.ok()) return on_error(written.status());
    if (written->empty()) {  // no room: the new version is the base, not the one it replaces
      if (replaces != nullptr) Drop(*replaces);
      return;
    }
    return Keep(blob, std::move(*written), replaces);
  }
  struct Leaving {
    ObjectId blob;
    ByteSpan memory;
    std::shared_ptr<const void> owner;
  };
  std::vector<Leaving> leaving;
  {
    std::vector<std::shared_ptr<const void>> released;  // freed after the lock is released
    std::lock_guard lock(mu_);
    InsertLocked(blob, replaces, Entry{blob, nullptr, memory, std::move(owner)}, &released);
    uint64_t staying = in_memory_;
    if (auto it = demotes != nullptr ? map_.find(*demotes) : map_.end();
        it != map_.end() && *demotes != blob && !it->second->memory.empty()) {
      staying -= it->second->memory.size();
      leaving.push_back(Leaving{it->second->blob, it->second->memory, it->second->owner});
    }
    for (auto it = lru_.rbegin(); staying > memory_capacity_ && it != lru_.rend(); ++it) {
      if (it->memory.empty() || (demotes != nullptr && it->blob == *demotes)) continue;
      staying -= it->memory.size();
      leaving.push_back(Leaving{it->blob, it->memory, it->owner});
    }
  }
  // Written outside the lock; readers keep reading the memory meanwhile.
  for (Leaving& l : leaving) {
    Result<Pending> written = Write(l.memory);
    if (!written.ok()) on_error(written.status());
    std::vector<std::shared_ptr<const void>> released;  // freed after the lock is released
    released.push_back(std::move(l.owner));
    std::lock_guard lock(mu_);
    auto it = map_.find(l.blob);
    if (it == map_.end() || it->second->memory.data() != l.memory.data()) continue;  // dropped or replaced meanwhile
    if (!written.ok() || written->empty()) {
      RemoveLocked(it->second, &released);
      continue;
    }
    Entry moved{l.blob, std::move(written->file_), {}, nullptr};
    const bool front = it->second == lru_.begin();
    RemoveLocked(it->second, &released);
    InsertLocked(l.blob, nullptr, std::move(moved), &released);
    if (!front) lru_.splice(lru_.end(), lru_, lru_.begin());  // keeps its place among the least recent
  }
}

void ReconstructionSpill::Drop(const ObjectId& blob) {
  std::vector<std::shared_ptr<const void>> released;  // freed after the lock is released
  std::lock_guard lock(mu_);
  if (auto held = held_.find(blob); held != held_.end()) {
    released.push_back(std::move(held->second.owner));
    held_.erase(held);
  }
  auto it = map_.find(blob);
  if (it == map_.end()) return;
  RemoveLocked(it->second, &released);
}

std::shared_ptr<ReconstructionSpill::Held> ReconstructionSpill::Hold(const ObjectId& blob, ByteSpan bytes,
                                                                     std::shared_ptr<const void> owner) {
  std::shared_ptr<Held> holder(new Held(this, blob));
  std::shared_ptr<const void> replaced;
  std::lock_guard lock(mu_);
  InMemory& entry = held_[blob];
  replaced = std::move(entry.owner);
  entry = InMemory{bytes, std::move(owner), holder.get()};
  return holder;
}

ReconstructionSpill::Held::~Held() {
  std::shared_ptr<const void> freed;  // outside the lock
  std::lock_guard lock(spill_->mu_);
  auto it = spill_->held_.find(blob_);
  if (it == spill_->held_.end() || it->second.holder != this) return;
  freed = std::move(it->second.owner);
  spill_->held_.erase(it);
}

ReconstructionSpill::Found ReconstructionSpill::Find(const ObjectId& blob) {
  std::lock_guard lock(mu_);
  auto it = map_.find(blob);
  if (it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    if (it->second->memory.empty()) return Found{true, it->second->file, {}, nullptr};
    return Found{true, nullptr, it->second->memory, it->second->owner};
  }
  if (auto held = held_.find(blob); held != held_.end())
    return Found{true, nullptr, held->second.bytes, held->second.owner};
  return Found{};
}

bool ReconstructionSpill::Read(const ObjectId& blob, uint64_t offset, MutableByteSpan out) {
  const Found found = Find(blob);
  if (found.file) return found.file->ReadAt(offset, out).ok();  // past its end, or unreadable: not kept
  const ByteSpan memory = found.memory;
  if (!found.kept || offset > memory.size() || out.size() > memory.size() - offset) return false;
  std::copy_n(memory.data() + offset, out.size(), out.data());
  return true;
}

std::optional<ChunkSpill::View> ReconstructionSpill::ViewInMemory(const ObjectId& blob, uint64_t offset,
                                                                 uint64_t length) {
  Found found = Find(blob);
  if (found.file || !found.kept || offset > found.memory.size() || length > found.memory.size() - offset)
    return std::nullopt;
  return View{std::move(found.owner), found.memory.subspan(offset, length)};
}

std::vector<ObjectId> ReconstructionSpill::Blobs() const {
  std::lock_guard lock(mu_);
  std::vector<ObjectId> out;
  out.reserve(lru_.size());
  for (const Entry& e : lru_) out.push_back(e.blob);
  return out;
}

uint64_t ReconstructionSpill::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

uint64_t ReconstructionSpill::memory_bytes() const {
  std::lock_guard lock(mu_);
  return in_memory_;
}

size_t ReconstructionSpill::count() const {
  std::lock_guard lock(mu_);
  return map_.size();
}

}  // namespace ckptfs::fs
