// The small I/O interface the codec uses: random-access reads of an
// immutable byte source (a blob in memory, an object file on disk), and a
// read-only memory map of a whole file for encoding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"

namespace ckptfs {

// An immutable sequence of bytes readable at any offset.
// Thread safety: ReadAt may be called concurrently.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  virtual uint64_t Size() const = 0;
  // Reads exactly out.size() bytes at `offset`. A read past Size() is
  // Corruption (callers only read ranges that a checked index names).
  virtual Status ReadAt(uint64_t offset, MutableByteSpan out) const = 0;
  // The whole content when it is already in memory (zero-copy), else empty.
  virtual ByteSpan Contiguous() const { return {}; }
  // The `length` bytes at `offset` in place, when the file can lend them
  // without a copy (in memory, mapped); empty when it cannot, and for a
  // range it cannot read (the caller then uses ReadAt, which reports why).
  // The bytes stay valid until EndView is given the span back.
  virtual ByteSpan View(uint64_t offset, uint64_t length) const {
    ByteSpan whole = Contiguous();
    if (whole.empty() || offset > whole.size() || length > whole.size() - offset) return {};
    return whole.subspan(offset, length);
  }
  // The caller is done with a span View returned.
  virtual void EndView(ByteSpan /*view*/) const {}
};

// Owns (or borrows) bytes in memory.
class MemoryFile final : public RandomAccessFile {
 public:
  explicit MemoryFile(std::vector<std::byte> owned);
  // REQUIRES: `borrowed` outlives this object.
  static std::unique_ptr<MemoryFile> Borrow(ByteSpan borrowed);
  uint64_t Size() const override { return data_.size(); }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const override;
  ByteSpan Contiguous() const override { return data_; }

 private:
  MemoryFile() = default;
  std::vector<std::byte> owned_;
  ByteSpan data_;
};

// A read-only file on disk read with pread. The size is fixed at open.
class PosixFile final : public RandomAccessFile {
 public:
  // `extra_flags` are added to O_RDONLY|O_CLOEXEC (e.g. O_NOFOLLOW).
  static Result<std::unique_ptr<PosixFile>> Open(const std::string& path, int extra_flags = 0);
  // Takes over `fd`, an open file of `size` bytes (`name` for messages).
  static std::unique_ptr<PosixFile> Adopt(int fd, uint64_t size, std::string name) {
    return std::unique_ptr<PosixFile>(new PosixFile(fd, size, std::move(name)));
  }
  ~PosixFile() override;
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;
  uint64_t Size() const override { return size_; }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const override;
  // The open descriptor (owned by this object), e.g. to map the file.
  int fd() const { return fd_; }

 private:
  PosixFile(int fd, uint64_t size, std::string path) : fd_(fd), size_(size), path_(std::move(path)) {}
  int fd_;
  uint64_t size_;
  std::string path_;
};

// A whole file mapped read-only (MAP_PRIVATE). An empty file maps to an
// empty span. Moves only.
class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path);
  static Result<MappedFile> FromFd(int fd, const std::string& path_for_errors);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  ~MappedFile();
  ByteSpan bytes() const { return {static_cast<const std::byte*>(addr_), size_}; }

 private:
  MappedFile(void* addr, size_t size) : addr_(addr), size_(size) {}
  void* addr_ = nullptr;
  size_t size_ = 0;
};

// A whole file mapped read-only, read as a RandomAccessFile without
// copies. For files the caller names and nobody changes while they are
// read (the commands' blobs): a page past the end of a file that shrank
// meanwhile would fault. Why not read it into memory: zero-filling and
// copying a 1 GB chain's blobs, and faulting in that fresh memory, came
// before any decode could start.
class MappedRandomAccessFile final : public RandomAccessFile {
 public:
  static Result<std::unique_ptr<MappedRandomAccessFile>> Open(const std::string& path);
  uint64_t Size() const override { return mapped_.bytes().size(); }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const override;
  ByteSpan Contiguous() const override { return mapped_.bytes(); }

 private:
  explicit MappedRandomAccessFile(MappedFile mapped) : mapped_(std::move(mapped)) {}
  MappedFile mapped_;
};

// Reads a whole file into memory / writes one (no fsync: callers that need
// durability do it themselves).
Result<std::vector<std::byte>> ReadWholeFile(const std::string& path);
Status WriteWholeFile(const std::string& path, ByteSpan data);
// Writes all of `data` to `fd` (retrying short writes and EINTR); errors
// name `path`.
Status WriteAll(int fd, ByteSpan data, const std::string& path);
// All of `data` at `offset` (pwrite, retried on short writes and EINTR).
Status WriteAllAt(int fd, uint64_t offset, ByteSpan data, const std::string& path);

}  // namespace ckptfs
