// The memory one decoded chunk lives in. Unlike std::vector, growing it
// does not zero-fill: a decode overwrites every byte, and the fill of a
// fresh 4 MiB buffer (on top of the kernel's own zeroing of the pages it
// faults in) was a visible share of a cold read.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <utility>

#include "codec/common/bytes.h"
#include "codec/container/chunk_arena.h"
#include "codec/tensor/scratch.h"

namespace ckptfs {

class ChunkBuffer {
 public:
  ChunkBuffer() = default;
  // Buffers under ChunkArena::kLargest bytes come from `arena` (blocks;
  // chunk_arena.h) while it has room, and the buffer keeps it alive.
  explicit ChunkBuffer(std::shared_ptr<ChunkArena> arena) : arena_(std::move(arena)) {}
  ChunkBuffer(const ChunkBuffer&) = delete;
  ChunkBuffer& operator=(const ChunkBuffer&) = delete;
  ~ChunkBuffer() { Release(); }

  // Sets the size to `size`. Contents are unspecified afterwards: the
  // memory is kept when it is large enough, else replaced (nothing copied).
  void Resize(size_t size) {
    set_verified(true);
    if (size > capacity_) {
      Release();
      if (arena_ != nullptr && size < ChunkArena::kLargest) data_ = arena_->Allocate(size);
      from_arena_ = data_ != nullptr;
      if (!from_arena_) {  // large, without an arena, or past the arena's bound
        large_ = ScratchBuffer::AllocateLarge(size);  // a mapping of its own from 4 MiB (scratch.h)
        data_ = large_.get();
      }
      capacity_ = size;
    }
    size_ = size;
  }

  // Whether the bytes were checked against the chunk's decoded checksum.
  // A chunk decoded as an input of a newer version in its delta chain is
  // not: the newer version's own checksum covers what the input gave it,
  // and the input is checked if and when it is read for itself.
  bool verified() const { return verified_.load(std::memory_order_acquire); }
  void set_verified(bool verified) const { verified_.store(verified, std::memory_order_release); }

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  ByteSpan span() const { return {data_, size_}; }
  MutableByteSpan mutable_span() { return {data_, size_}; }

 private:
  void Release() {
    if (from_arena_) arena_->Free(data_);
    large_.reset();
    data_ = nullptr;
    from_arena_ = false;
    size_ = capacity_ = 0;
  }
  std::shared_ptr<ChunkArena> arena_;
  ScratchBuffer::Memory large_;  // the memory when not the arena's
  std::byte* data_ = nullptr;
  bool from_arena_ = false;
  size_t size_ = 0;
  size_t capacity_ = 0;
  mutable std::atomic<bool> verified_{true};  // reset by the decoder of an unchecked input
};

}  // namespace ckptfs
