#include "codec/container/chunk_arena.h"

#include <cassert>
#include <new>

namespace ckptfs {

namespace {
constexpr size_t kAlign = 64;
}  // namespace

std::byte* ChunkArena::Allocate(size_t n) {
  assert(n > 0 && n < kLargest);
  const size_t rounded = (n + kAlign - 1) / kAlign * kAlign;
  std::lock_guard lock(mu_);
  if (current_ == blocks_.end() || current_->second.used + rounded > kBlockBytes) {
    // (An empty current block has used == 0: the allocation fits it.)
    if (!spare_.empty()) {
      current_ = spare_.back();
      spare_.pop_back();
    } else {
      if (blocks_.size() >= max_blocks_) return nullptr;
      ScratchBuffer::Memory memory = ScratchBuffer::AllocateLarge(kBlockBytes);
      const std::byte* start = memory.get();
      current_ = blocks_.emplace(start, Block{std::move(memory), 0, 0}).first;
    }
  }
  Block& block = current_->second;
  std::byte* p = block.memory.get() + block.used;
  block.used += rounded;
  ++block.live;
  return p;
}

void ChunkArena::Free(const std::byte* p) {
  std::lock_guard lock(mu_);
  auto it = blocks_.upper_bound(p);
  assert(it != blocks_.begin());
  --it;
  Block& block = it->second;
  assert(block.live > 0 && p < it->first + kBlockBytes);
  if (--block.live > 0) return;
  block.used = 0;  // empty: cut from its start again (its memory is warm)
  if (it == current_) return;
  if (spare_.size() < kSpareBlocks) {
    spare_.push_back(it);
  } else {
    blocks_.erase(it);  // its memory goes back
  }
}

size_t ChunkArena::blocks() const {
  std::lock_guard lock(mu_);
  return blocks_.size();
}

}  // namespace ckptfs
