// Memory for decoded chunks smaller than ScratchBuffer's mapping size
// (4 MiB), cut from blocks of 8 MiB.
//
// Why: a chunk buffer under 4 MiB came from malloc, and a chain decode
// writes every chunk of every level into fresh memory (the cache keeps
// them). Blocks that the cache reuses keep that memory touched; and a
// block is its own mapping, returned to the system when freed, where
// malloc's heaps kept holes.
//
// Allocations are cut from the current block one after the other
// (64-byte aligned, so that two threads' chunks share no cache line) and a
// block is reused once every allocation in it is freed. Chunk buffers are
// kept and reused by the chunk cache's idle list, so allocations are few
// and live long. The cost: a block stays whole while
// any allocation in it lives (blocks empty in about the order they filled,
// as the cache's LRU frees them, but a few long-lived chunks can hold many
// blocks). So the blocks are bounded: past `max_bytes` of them, Allocate
// returns null and the caller takes ordinary memory, and the memory behind
// a cache's chunks stays within twice what it counts in the worst case.
//
// Thread safety: Allocate and Free from any thread.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "codec/tensor/scratch.h"

namespace ckptfs {

class ChunkArena {
 public:
  static constexpr size_t kBlockBytes = size_t{8} << 20;
  // Allocations of at least this many bytes are not the arena's (they get
  // a mapping of their own from ScratchBuffer::AllocateLarge).
  static constexpr size_t kLargest = ScratchBuffer::kMappedFrom;
  // Empty blocks kept for the next allocations beyond the current one (the
  // others are freed).
  static constexpr size_t kSpareBlocks = 2;

  explicit ChunkArena(size_t max_bytes) : max_blocks_(max_bytes / kBlockBytes) {}
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;
  // REQUIRES: every allocation was freed (holders keep the arena alive).
  ~ChunkArena() = default;

  // Uninitialised memory of `n` bytes, 0 < n < kLargest, 64-byte aligned;
  // null when it would take a block beyond `max_bytes`. Throws
  // std::bad_alloc when the memory of a block cannot be had.
  std::byte* Allocate(size_t n);
  // REQUIRES: `p` came from Allocate of this arena and was not freed since.
  void Free(const std::byte* p);

  // For tests: blocks held (in use or spare).
  size_t blocks() const;

 private:
  struct Block {
    ScratchBuffer::Memory memory;
    size_t used = 0;  // bytes cut so far
    size_t live = 0;  // allocations not yet freed
  };
  using Blocks = std::map<const std::byte*, Block>;  // by start address
  const size_t max_blocks_;
  mutable std::mutex mu_;
  Blocks blocks_;
  Blocks::iterator current_ = blocks_.end();  // the block allocations are cut from
  std::vector<Blocks::iterator> spare_;       // empty blocks other than the current one
};

}  // namespace ckptfs
