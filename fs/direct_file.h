// A file the daemon writes once and then reads in pieces, moved between its
// memory and the disk with O_DIRECT: around the page cache.
//
// Why: the reconstruction spill (reconstruction_spill.h) writes a large
// file's reconstruction after every commit, and the next version's encode
// reads it back. Through the page cache, each write fills fresh cache
// pages, and on a machine whose fresh memory is slow to touch (a virtual
// machine that hands freed memory back to its host) that fill was a fifth
// of the daemon's CPU over a training run's saves: a C program writing
// 600 MiB from a warm buffer took 1.5-2.0 s of CPU buffered against 0.02 s
// with O_DIRECT, and read it back with O_DIRECT in 0.01 s of CPU
// (docs/bench.md, "The spill around the page cache").
//
// Where the filesystem refuses O_DIRECT (tmpfs, some FUSE filesystems) the
// same calls go through the page cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/io.h"
#include "codec/common/status.h"
#include "codec/tensor/scratch.h"

namespace ckptfs::fs {

// Aligned windows for the pieces of a direct transfer that the caller's
// memory cannot take as they are (unaligned addresses, a file's tail).
// Thread-safe; a few idle windows are kept for the next transfer (fresh
// memory is what the direct path avoids).
class BounceWindows {
 public:
  // Offsets, lengths and addresses of direct transfers are multiples of
  // this (the largest logical block size in common use).
  static constexpr size_t kAlign = 4096;
  // A window's size: the most one transfer through it moves.
  static constexpr size_t kBytes = size_t{4} << 20;
  static constexpr size_t kMaxIdle = 4;

  class Lease {
   public:
    Lease(BounceWindows* owner, ScratchBuffer::Memory memory) : owner_(owner), memory_(std::move(memory)) {}
    Lease(Lease&&) noexcept = default;  // the moved-from one returns nothing
    Lease& operator=(Lease&&) = delete;
    ~Lease() { owner_->Return(std::move(memory_)); }
    std::byte* data() { return memory_.get(); }

   private:
    BounceWindows* owner_;
    ScratchBuffer::Memory memory_;
  };
  Lease Take();
  // Idle windows now (tests).
  size_t idle() const;

 private:
  void Return(ScratchBuffer::Memory memory);
  mutable std::mutex mu_;  // leaf lock
  std::vector<ScratchBuffer::Memory> idle_;
};

class DirectFile final : public RandomAccessFile {
 public:
  // Writes `data` into `fd` (an empty file open for reading and writing,
  // taken over: closed with the result, or on failure) and returns the
  // file for reading it back, through `windows` where it must.
  static Result<std::unique_ptr<DirectFile>> Write(int fd, ByteSpan data, std::string name,
                                                   std::shared_ptr<BounceWindows> windows);
  ~DirectFile() override;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  uint64_t Size() const override { return size_; }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const override;
  // Whether the bytes moved around the page cache.
  bool direct() const { return direct_; }

 private:
  DirectFile(int fd, uint64_t size, std::string name, std::shared_ptr<BounceWindows> windows, bool direct)
      : fd_(fd), size_(size), name_(std::move(name)), windows_(std::move(windows)), direct_(direct) {}
  Status WriteDirect(ByteSpan data);
  Status ReadDirect(uint64_t offset, MutableByteSpan out) const;
  int fd_;
  uint64_t size_;
  std::string name_;
  std::shared_ptr<BounceWindows> windows_;
  bool direct_;
};

}  // namespace ckptfs::fs
