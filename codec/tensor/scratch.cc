#include "codec/tensor/scratch.h"

#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "codec/tensor/lossy/lossy.h"

namespace ckptfs {

void ScratchMemoryFree::operator()(std::byte* p) const {
  if (mapped != 0) ::munmap(p, mapped);
  else std::free(p);
}

ScratchBuffer::Memory ScratchBuffer::AllocateLarge(size_t n, Pages pages) {
  if (n < kMappedFrom) {
    void* p = std::malloc(n);
    if (p == nullptr) throw std::bad_alloc();
    return Memory(static_cast<std::byte*>(p));
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t rounded = (n + page - 1) / page * page;
  // In the system's default pages: no transparent huge pages asked for
  // (scratch.h says why), and populated at once (scratch.h too).
  const int populate = pages == Pages::kPopulated ? MAP_POPULATE : 0;
  void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | populate, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return Memory(static_cast<std::byte*>(p), Free{rounded});
}

void ScratchBuffer::PopulateForWrite(MutableByteSpan bytes) {
  if (bytes.size() < kMappedFrom / 4) return;  // not worth a call
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(bytes.data()) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(bytes.data() + bytes.size());
  // Errors (EINVAL before Linux 5.14, ENOMEM) leave the pages to the writes.
  ::madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE);
}

CodecScratch::CodecScratch() = default;

ZSTD_CCtx_s* CodecScratch::cctx() {
  if (cctx_ == nullptr) cctx_ = ZSTD_createCCtx();
  if (cctx_ == nullptr) throw std::bad_alloc();
  return cctx_;
}

ZSTD_DCtx_s* CodecScratch::dctx() {
  if (dctx_ == nullptr) dctx_ = ZSTD_createDCtx();
  if (dctx_ == nullptr) throw std::bad_alloc();
  return dctx_;
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
