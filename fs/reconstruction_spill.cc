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

ReconstructionSpill::Pending::Pending(Pending&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

ReconstructionSpill::Pending& ReconstructionSpill::Pending::operator=(Pending&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

ReconstructionSpill::Pending::~Pending() {
  if (fd_ >= 0) ::close(fd_);
}

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

ReconstructionSpill::ReconstructionSpill(std::string dir, uint64_t capacity_bytes, SpaceProbe probe)
    : dir_(std::move(dir)),
      capacity_(capacity_bytes),
      probe_(probe ? std::move(probe) : [d = dir_] { return StatvfsSpace(d); }) {}

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
    std::shared_ptr<const PosixFile> dropped;
    std::lock_guard lock(mu_);
    if (lru_.empty()) return false;
    dropped = lru_.back().file;
    RemoveLocked(std::prev(lru_.end()));
  }
}

Result<ReconstructionSpill::Pending> ReconstructionSpill::Write(ByteSpan reconstruction) {
  if (reconstruction.empty() || reconstruction.size() > capacity_ || !MakeRoom(reconstruction.size()))
    return Pending();
  ASSIGN_OR_RETURN(int fd, OpenUnnamed());
  Pending pending(fd, reconstruction.size());
  RETURN_IF_ERROR(WriteAll(fd, reconstruction, "a reconstruction in " + dir_));
  return pending;
}

void ReconstructionSpill::RemoveLocked(std::list<Entry>::iterator it) {
  bytes_ -= it->file->Size();
  map_.erase(it->blob);
  lru_.erase(it);
}

void ReconstructionSpill::Keep(const ObjectId& blob, Pending pending, const ObjectId* replaces) {
  if (pending.empty()) return;
  std::shared_ptr<const PosixFile> file =
      PosixFile::Adopt(std::exchange(pending.fd_, -1), pending.size_, "reconstruction in " + dir_);
  std::vector<std::shared_ptr<const PosixFile>> closed;  // closed after the lock is released
  std::lock_guard lock(mu_);
  for (const ObjectId* id : {&blob, replaces}) {
    if (id == nullptr) continue;
    auto it = map_.find(*id);
    if (it == map_.end()) continue;
    closed.push_back(it->second->file);
    RemoveLocked(it->second);
  }
  while (!lru_.empty() && (bytes_ + file->Size() > capacity_ || map_.size() >= kMaxEntries)) {
    closed.push_back(lru_.back().file);
    RemoveLocked(std::prev(lru_.end()));
  }
  bytes_ += file->Size();
  lru_.push_front(Entry{blob, std::move(file)});
  map_.emplace(blob, lru_.begin());
}

void ReconstructionSpill::Drop(const ObjectId& blob) {
  std::shared_ptr<const PosixFile> closed;
  std::shared_ptr<const void> freed;
  std::lock_guard lock(mu_);
  if (auto held = held_.find(blob); held != held_.end()) {
    freed = std::move(held->second.owner);
    held_.erase(held);
  }
  auto it = map_.find(blob);
  if (it == map_.end()) return;
  closed = it->second->file;
  RemoveLocked(it->second);
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

bool ReconstructionSpill::Read(const ObjectId& blob, uint64_t offset, MutableByteSpan out) {
  std::shared_ptr<const PosixFile> file;
  ByteSpan memory;
  std::shared_ptr<const void> owner;
  {
    std::lock_guard lock(mu_);
    auto it = map_.find(blob);
    if (it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      file = it->second->file;
    } else if (auto held = held_.find(blob); held != held_.end()) {
      memory = held->second.bytes;
      owner = held->second.owner;
    } else {
      return false;
    }
  }
  if (file) return file->ReadAt(offset, out).ok();  // past its end, or unreadable: not held
  if (offset > memory.size() || out.size() > memory.size() - offset) return false;
  std::copy_n(memory.data() + offset, out.size(), out.data());
  return true;
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

size_t ReconstructionSpill::count() const {
  std::lock_guard lock(mu_);
  return map_.size();
}

}  // namespace ckptfs::fs
