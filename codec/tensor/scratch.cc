#include "codec/tensor/scratch.h"

#include <sys/mman.h>
#include <zstd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "codec/tensor/lossy/lossy.h"

namespace ckptfs {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void ScratchMemoryFree::operator()(std::byte* p) const {
  if (mapped != 0) ::munmap(p, mapped);
  else std::free(p);
}

ScratchBuffer::Memory ScratchBuffer::AllocateLarge(size_t n) {
  if (n < kHugePageFrom) {
    void* p = std::malloc(n);
    if (p == nullptr) throw std::bad_alloc();
    return Memory(static_cast<std::byte*>(p));
  }
  const size_t rounded = (n + kHugePage - 1) / kHugePage * kHugePage;
  // Mapped with a huge page to spare, then trimmed to a 2 MiB boundary.
  void* raw = ::mmap(nullptr, rounded + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t at = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (at + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > at) ::munmap(raw, aligned - at);
  const size_t tail = (at + rounded + kHugePage) - (aligned + rounded);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + rounded), tail);
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, rounded, MADV_HUGEPAGE);  // advisory: without it the memory is only slower to touch
  return Memory(static_cast<std::byte*>(p), Free{rounded});
}

CodecScratch::CodecScratch() : cctx_(ZSTD_createCCtx()), dctx_(ZSTD_createDCtx()) {
  if (cctx_ == nullptr || dctx_ == nullptr) {
    ZSTD_freeCCtx(cctx_);
    ZSTD_freeDCtx(dctx_);
    throw std::bad_alloc();
  }
}

lossy::Scratch& CodecScratch::lossy() {
  if (!lossy_) lossy_ = std::make_unique<lossy::Scratch>();
  return *lossy_;
}

CodecScratch::~CodecScratch() {
  ZSTD_freeCCtx(cctx_);
  ZSTD_freeDCtx(dctx_);
}

}  // namespace ckptfs
