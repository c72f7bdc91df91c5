#include "fs/object_file.h"

#include <fcntl.h>
#include <sys/mman.h>
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
  ASSIGN_OR_RETURN(std::unique_ptr<PosixFile> file, PosixFile::Open(path, O_NOFOLLOW));
  const uint64_t size = file->Size();
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, file->fd(), 0);
    if (map == MAP_FAILED) map = nullptr;  // pread alone
  }
  return std::unique_ptr<ObjectFile>(new ObjectFile(std::move(file), map));
}

ObjectFile::~ObjectFile() {
  if (map_ != nullptr) ::munmap(map_, file_->Size());
}

Status ObjectFile::ReadAt(uint64_t offset, MutableByteSpan out) const { return file_->ReadAt(offset, out); }

ByteSpan ObjectFile::View(uint64_t offset, uint64_t length) const {
  if (map_ == nullptr || length == 0 || offset > file_->Size() || length > file_->Size() - offset ||
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
