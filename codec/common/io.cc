#include "codec/common/io.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <utility>

namespace ckptfs {

MemoryFile::MemoryFile(std::vector<std::byte> owned) : owned_(std::move(owned)), data_(owned_) {}

std::unique_ptr<MemoryFile> MemoryFile::Borrow(ByteSpan borrowed) {
  std::unique_ptr<MemoryFile> f(new MemoryFile());
  f->data_ = borrowed;
  return f;
}

namespace {
// A RandomAccessFile read of bytes that are in memory.
Status ReadFromMemory(ByteSpan data, uint64_t offset, MutableByteSpan out) {
  if (offset > data.size() || out.size() > data.size() - offset)
    return Status::Corruption(
        fmt::format("read of {} bytes at {} is past the end ({} bytes)", out.size(), offset, data.size()));
  if (!out.empty()) std::memcpy(out.data(), data.data() + offset, out.size());
  return Status::Ok();
}
}  // namespace

Status MemoryFile::ReadAt(uint64_t offset, MutableByteSpan out) const { return ReadFromMemory(data_, offset, out); }

Result<std::unique_ptr<PosixFile>> PosixFile::Open(const std::string& path, int extra_flags) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags);
  if (fd < 0) return Status::Io(errno, "open " + path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Io(err, "fstat " + path);
  }
  return std::unique_ptr<PosixFile>(new PosixFile(fd, static_cast<uint64_t>(st.st_size), path));
}

PosixFile::~PosixFile() { ::close(fd_); }

Status PosixFile::ReadAt(uint64_t offset, MutableByteSpan out) const {
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

Result<MappedFile> MappedFile::FromFd(int fd, const std::string& path_for_errors) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::Io(errno, "fstat " + path_for_errors);
  size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return MappedFile(nullptr, 0);
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (addr == MAP_FAILED) return Status::Io(errno, "mmap " + path_for_errors);
  ::madvise(addr, size, MADV_SEQUENTIAL);
  return MappedFile(addr, size);
}

Result<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Io(errno, "open " + path);
  auto mapped = FromFd(fd, path);
  ::close(fd);
  return mapped;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (addr_ != nullptr) ::munmap(addr_, size_);
    addr_ = std::exchange(other.addr_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
}

Result<std::unique_ptr<MappedRandomAccessFile>> MappedRandomAccessFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  return std::unique_ptr<MappedRandomAccessFile>(new MappedRandomAccessFile(std::move(mapped)));
}

Status MappedRandomAccessFile::ReadAt(uint64_t offset, MutableByteSpan out) const {
  return ReadFromMemory(mapped_.bytes(), offset, out);
}

Result<std::vector<std::byte>> ReadWholeFile(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, PosixFile::Open(path));
  std::vector<std::byte> data(file->Size());
  RETURN_IF_ERROR(file->ReadAt(0, data));
  return data;
}

namespace {
// write(2) at the file position, or pwrite(2) at `offset`, until all of
// `data` is written.
Status WriteAllFrom(int fd, std::optional<uint64_t> offset, ByteSpan data, const std::string& path) {
  for (size_t done = 0; done < data.size();) {
    const std::byte* from = data.data() + done;
    const size_t left = data.size() - done;
    const ssize_t n = offset ? ::pwrite(fd, from, left, static_cast<off_t>(*offset + done)) : ::write(fd, from, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Io(errno, "write " + path);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}
}  // namespace

Status WriteAll(int fd, ByteSpan data, const std::string& path) { return WriteAllFrom(fd, std::nullopt, data, path); }

Status WriteAllAt(int fd, uint64_t offset, ByteSpan data, const std::string& path) {
  return WriteAllFrom(fd, offset, data, path);
}

Status WriteWholeFile(const std::string& path, ByteSpan data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Io(errno, "create " + path);
  if (Status s = WriteAll(fd, data, path); !s.ok()) {
    ::close(fd);
    return s;
  }
  if (::close(fd) != 0) return Status::Io(errno, "close " + path);
  return Status::Ok();
}

}  // namespace ckptfs
