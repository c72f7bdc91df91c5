// The memory one decoded chunk lives in. Unlike std::vector, growing it
// does not zero-fill: a decode overwrites every byte, and the fill of a
// fresh 4 MiB buffer (on top of the kernel's own zeroing of the pages it
// faults in) was a visible share of a cold read.
#pragma once

#include <cstddef>
#include <memory>

#include "codec/common/bytes.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

class ChunkBuffer {
 public:
  ChunkBuffer() = default;
  ChunkBuffer(const ChunkBuffer&) = delete;
  ChunkBuffer& operator=(const ChunkBuffer&) = delete;

  // Sets the size to `size`. Contents are unspecified afterwards: the
  // memory is kept when it is large enough, else replaced (nothing copied).
  void Resize(size_t size) {
    if (size > capacity_) {
      bytes_ = ScratchBuffer::AllocateLarge(size);  // huge pages from 4 MiB (scratch.h)
      capacity_ = size;
    }
    size_ = size;
  }

  std::byte* data() { return bytes_.get(); }
  const std::byte* data() const { return bytes_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  ByteSpan span() const { return {bytes_.get(), size_}; }
  MutableByteSpan mutable_span() { return {bytes_.get(), size_}; }

 private:
  ScratchBuffer::Memory bytes_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace ckptfs
