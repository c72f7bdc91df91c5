#include "codec/tensor/scratch.h"

#include <sys/mman.h>
#include <zstd.h>

#include <cstdlib>
#include <memory>
#include <new>

#include "codec/tensor/lossy/lossy.h"

namespace ckptfs {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void ScratchBuffer::Free::operator()(std::byte* p) const { std::free(p); }

ScratchBuffer::Memory ScratchBuffer::AllocateLarge(size_t n) {
  if (n < kHugePageFrom) {
    void* p = std::malloc(n);
    if (p == nullptr) throw std::bad_alloc();
    return Memory(static_cast<std::byte*>(p));
  }
  const size_t rounded = (n + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) throw std::bad_alloc();
  ::madvise(p, rounded, MADV_HUGEPAGE);  // advisory: without it the memory is only slower to touch
  return Memory(static_cast<std::byte*>(p));
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
