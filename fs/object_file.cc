#include "fs/object_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace ckptfs::fs {
namespace {

const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

// The whole pages that hold [offset, offset + length) of a mapping at `base`.
std::pair<std::byte*, size_t> PagesOf(void* base, uint64_t offset, uint64_t length) {
  const uint64_t first = offset / kPage * kPage;
  const uint64_t end = (offset + length + kPage - 1) / kPage * kPage;
  return {static_cast<std::byte*>(base) + first, static_cast<size_t>(end - first)};
}

}  // namespace

Result<std::unique_ptr<ObjectFile>> ObjectFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::Io(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Io(err, "fstat " + path);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) map = nullptr;  // pread alone
  }
  return std::unique_ptr<ObjectFile>(new ObjectFile(fd, size, path, map));
}

ObjectFile::~ObjectFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
  ::close(fd_);
}

Status ObjectFile::ReadAt(uint64_t offset, MutableByteSpan out) const {
  if (offset > size_ || out.size() > size_ - offset)
    return Status::Corruption(
        fmt::format("{}: read of {} bytes at {} is past the end ({} bytes)", path_, out.size(), offset, size_));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Io(errno, "pread " + path_);
    }
    if (n == 0) return Status::Corruption(fmt::format("{}: file shrank below {} bytes", path_, offset + done));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

ByteSpan ObjectFile::View(uint64_t offset, uint64_t length) const {
  if (map_ == nullptr || length == 0 || offset > size_ || length > size_ - offset ||
      !populate_works_.load(std::memory_order_relaxed))
    return {};
  auto [pages, bytes] = PagesOf(map_, offset, length);
  while (::madvise(pages, bytes, MADV_POPULATE_READ) != 0) {
    if (errno == EINTR) continue;
    if (errno == EINVAL) populate_works_.store(false, std::memory_order_relaxed);  // older kernel
    return {};
  }
  return ByteSpan(static_cast<const std::byte*>(map_) + offset, length);
}

void ObjectFile::EndView(ByteSpan view) const {
  if (map_ == nullptr || view.empty()) return;
  const uint64_t offset = static_cast<uint64_t>(view.data() - static_cast<const std::byte*>(map_));
  auto [pages, bytes] = PagesOf(map_, offset, view.size());
  ::madvise(pages, bytes, MADV_DONTNEED);
}

}  // namespace ckptfs::fs
