#include "fs/direct_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include <fmt/format.h>

namespace ckptfs::fs {

namespace {

constexpr size_t kAlign = BounceWindows::kAlign;
// The most one system call moves straight from or to the caller's memory.
constexpr size_t kMostPerCall = size_t{64} << 20;

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlign == 0; }
uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Writes all `length` bytes at `offset`; the errno of a failure, else 0.
int PwriteAll(int fd, const std::byte* from, size_t length, uint64_t offset) {
  for (size_t done = 0; done < length;) {
    const ssize_t n = ::pwrite(fd, from + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

// Reads up to `length` bytes at `offset`, fewer only at the end of the
// file; the count, or -errno.
ssize_t PreadUpTo(int fd, std::byte* to, size_t length, uint64_t offset) {
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, to + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -errno;
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace

BounceWindows::Lease BounceWindows::Take() {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      ScratchBuffer::Memory memory = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(memory));
    }
  }
  // kBytes is at least ScratchBuffer::kMappedFrom: a mapping of its own,
  // aligned to the page.
  static_assert(kBytes >= ScratchBuffer::kMappedFrom);
  return Lease(this, ScratchBuffer::AllocateLarge(kBytes));
}

void BounceWindows::Return(ScratchBuffer::Memory memory) {
  if (!memory) return;
  std::lock_guard lock(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(memory));
}

size_t BounceWindows::idle() const {
  std::lock_guard lock(mu_);
  return idle_.size();
}

Result<std::unique_ptr<DirectFile>> DirectFile::Write(int fd, ByteSpan data, std::string name,
                                                      std::shared_ptr<BounceWindows> windows) {
  const int flags = ::fcntl(fd, F_GETFL);
  const bool direct = flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
  std::unique_ptr<DirectFile> file(new DirectFile(fd, data.size(), std::move(name), std::move(windows), direct));
  if (direct) {
    Status written = file->WriteDirect(data);
    if (written.ok()) return file;
    // A filesystem that takes the flag but refuses the transfers (another
    // alignment, or none at all): the page cache, from the start.
    if (written.sys_errno() != EINVAL) return written;
    if (::fcntl(fd, F_SETFL, flags) != 0) return Status::Io(errno, "clear O_DIRECT on " + file->name_);
    file->direct_ = false;
  }
  if (::ftruncate(fd, 0) != 0) return Status::Io(errno, "truncate " + file->name_);
  RETURN_IF_ERROR(WriteAllAt(fd, 0, data, file->name_));
  return file;
}

DirectFile::~DirectFile() { ::close(fd_); }

Status DirectFile::WriteDirect(ByteSpan data) {
  for (size_t done = 0; done < data.size();) {
    const std::byte* from = data.data() + done;
    const size_t left = data.size() - done;
    size_t covered, length;  // bytes of `data` this step writes; bytes it transfers
    const std::byte* source = from;
    std::optional<BounceWindows::Lease> window;
    if (left >= kAlign && Aligned(from)) {
      covered = length = std::min(left / kAlign * kAlign, kMostPerCall);
    } else {  // through a window: an unaligned source, or the tail padded with zeros
      window.emplace(windows_->Take());
      covered = std::min(left, BounceWindows::kBytes);
      length = RoundUp(covered);
      std::memcpy(window->data(), from, covered);
      std::memset(window->data() + covered, 0, length - covered);
      source = window->data();
    }
    if (int err = PwriteAll(fd_, source, length, done); err != 0)
      return Status::Io(err, fmt::format("write {} bytes at {} of {}", length, done, name_));
    done += covered;
  }
  if (data.size() % kAlign != 0 && ::ftruncate(fd_, static_cast<off_t>(data.size())) != 0)
    return Status::Io(errno, "truncate " + name_);
  return Status::Ok();
}

Status DirectFile::ReadAt(uint64_t offset, MutableByteSpan out) const {
  if (offset > size_ || out.size() > size_ - offset)
    return Status::Corruption(
        fmt::format("{}: read of {} bytes at {} is past the end ({} bytes)", name_, out.size(), offset, size_));
  if (!direct_) {
    const ssize_t n = PreadUpTo(fd_, out.data(), out.size(), offset);
    if (n < 0) return Status::Io(static_cast<int>(-n), "pread " + name_);
    if (static_cast<size_t>(n) != out.size())
      return Status::Corruption(fmt::format("{}: file shrank below {} bytes", name_, offset + out.size()));
    return Status::Ok();
  }
  return ReadDirect(offset, out);
}

Status DirectFile::ReadDirect(uint64_t offset, MutableByteSpan out) const {
  for (size_t done = 0; done < out.size();) {
    const uint64_t at = offset + done;
    const size_t left = out.size() - done;
    std::byte* to = out.data() + done;
    if (at % kAlign == 0 && Aligned(to) && left >= kAlign) {  // straight into the caller's memory
      const size_t length = std::min(left / kAlign * kAlign, kMostPerCall);
      const ssize_t n = PreadUpTo(fd_, to, length, at);
      if (n < 0) return Status::Io(static_cast<int>(-n), "pread " + name_);
      if (static_cast<size_t>(n) != length)
        return Status::Corruption(fmt::format("{}: file shrank below {} bytes", name_, at + length));
      done += length;
      continue;
    }
    BounceWindows::Lease window = windows_->Take();
    const uint64_t start = at / kAlign * kAlign;
    const size_t skip = static_cast<size_t>(at - start);
    const size_t length = std::min<uint64_t>(BounceWindows::kBytes, RoundUp(skip + left));
    const ssize_t n = PreadUpTo(fd_, window.data(), length, start);  // short at the end of the file
    if (n < 0) return Status::Io(static_cast<int>(-n), "pread " + name_);
    const size_t want = std::min(length - skip, left);
    if (static_cast<size_t>(n) < skip + want)
      return Status::Corruption(fmt::format("{}: file shrank below {} bytes", name_, at + want));
    std::memcpy(to, window.data() + skip, want);
    done += want;
  }
  return Status::Ok();
}

}  // namespace ckptfs::fs
