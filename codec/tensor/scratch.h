// Reusable working memory for the chunk codecs. Fresh allocations are slow
// (page faults on every new buffer), so each worker thread keeps one
// CodecScratch and reuses its buffers and zstd contexts for every chunk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "codec/common/bytes.h"

struct ZSTD_CCtx_s;
namespace ckptfs::lossy {
class Scratch;
}
struct ZSTD_DCtx_s;

namespace ckptfs {

// The deleter of ScratchBuffer::AllocateLarge's memory (outside the class:
// a nested class's member initializers are not usable in its enclosing
// class's own members).
struct ScratchMemoryFree {
  size_t mapped = 0;  // bytes mapped by AllocateLarge; 0: from malloc
  void operator()(std::byte* p) const;
};

// A grow-only byte buffer whose contents are left uninitialised (a
// std::vector would zero every byte it grows by).
// Thread safety: none; one owner.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  // A moved-from buffer is empty (capacity 0), so its next Reserve allocates.
  ScratchBuffer(ScratchBuffer&& other) noexcept
      : data_(std::move(other.data_)), capacity_(std::exchange(other.capacity_, 0)) {}
  ScratchBuffer& operator=(ScratchBuffer&& other) noexcept {
    data_ = std::move(other.data_);
    capacity_ = std::exchange(other.capacity_, 0);
    return *this;
  }
  // How a fresh mapping gets its pages (AllocateLarge).
  enum class Pages {
    kPopulated,    // all of them when it is made
    kOnFirstTouch  // each when first written, or by PopulateForWrite
  };
  // Returns at least `n` writable bytes; earlier contents are not kept.
  std::byte* Reserve(size_t n, Pages pages = Pages::kPopulated) {
    if (n > capacity_) {
      data_ = AllocateLarge(n, pages);
      capacity_ = n;
    }
    return data_.get();
  }
  // Reserve for a buffer that is written only sometimes (the copy a view
  // of a cached chunk falls back to when the reader does not hold the
  // bytes): its pages are mapped when written. Populated when reserved,
  // four or five such buffers per decode scratch were 200-300 MB of a
  // cold 957 MB load's peak RSS, never written.
  std::byte* ReserveForFallback(size_t n) { return Reserve(n, Pages::kOnFirstTouch); }
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }

  using Free = ScratchMemoryFree;
  using Memory = std::unique_ptr<std::byte[], Free>;
  // Uninitialised memory of n bytes; from kMappedFrom bytes on, a mapping
  // of its own, so that freeing it returns it to the system. (From malloc,
  // such blocks came out of the heaps of the threads' malloc arenas once
  // glibc's dynamic mmap threshold had risen past them, where the alignment
  // left holes: a chain decode on two threads peaked at 1.5 GB for a 957 MB
  // file, against 0.6 GB mapped.) No transparent huge pages are asked for:
  // on virtual machines that hand freed memory back to their host, a huge
  // page's first touch ran at 0.36-0.61 GB/s against 1.6-2.6 GB/s for the
  // same bytes in 4 KiB pages, and a large file's encode, decode or commit
  // writes most of its memory once (docs/bench.md, "Memory in the system's
  // pages"). Where the system uses huge pages for every mapping, so be it.
  // The mapping is populated when made (MAP_POPULATE): its callers write
  // it whole at once, and one call that maps every page took a 600 MiB
  // first touch from 1.7-2.1 s to 1.0-1.1 s here, where each page's fault
  // is a trip through the hypervisor (docs/bench.md, "Mappings populated
  // when made"). A buffer that several threads write, each its own part
  // (a file's reconstruction), is mapped kOnFirstTouch and each part
  // populated by its writer (PopulateForWrite): populated when made, the
  // zeroing of its pages ran on one thread before the others started.
  static constexpr size_t kMappedFrom = size_t{4} << 20;
  static Memory AllocateLarge(size_t n, Pages pages = Pages::kPopulated);
  // Maps the pages under `bytes` for writing, where they are not yet (a
  // part of a kOnFirstTouch mapping; pages already mapped stay as they
  // are, and so do the bytes). Advice: on a kernel without it, the writes
  // fault the pages in as before.
  static void PopulateForWrite(MutableByteSpan bytes);

 private:
  Memory data_;
  size_t capacity_ = 0;
};

// Per-thread codec state: zstd contexts and plane buffers.
// Thread safety: none; one user at a time (readers lease one from a
// CodecScratchPool, scratch_pool.h).
class CodecScratch {
 public:
  CodecScratch();
  ~CodecScratch();
  CodecScratch(const CodecScratch&) = delete;
  CodecScratch& operator=(const CodecScratch&) = delete;

  // zstd contexts, created on first use (a reader's scratch never
  // compresses; a lossy chunk's decode uses the lossy scratch's own).
  ZSTD_CCtx_s* cctx();
  ZSTD_DCtx_s* dctx();
  // The lossy codec's buffers, created on first use.
  lossy::Scratch& lossy();

  ScratchBuffer planes;    // split planes (encode) or decoded planes (decode)
  ScratchBuffer xored;     // XOR residual against the base
  ScratchBuffer base;      // base version bytes for delta chunks
  // What a view of the base's bytes points into (BlobReader::ViewAt: a
  // cached chunk, a kept reconstruction) until the next one replaces it;
  // released when the encode ends, so that it pins nothing after it.
  std::shared_ptr<const void> base_hold;
  ScratchBuffer candidate; // a second encoding when codecs compete
  ScratchBuffer decoded;   // a decoded chunk not wholly wanted by a read
  ScratchBuffer stored;    // a chunk's stored bytes read from a file
  ScratchBuffer packed;    // a chunk's non-zero elements (sparse byte planes)
  ScratchBuffer zero_mask; // which elements are zero (sparse byte planes)
  // A step-predicted chunk: its inputs (m, v, m_base, v_base) and the
  // prediction it is a delta frame against.
  ScratchBuffer step_inputs[4];
  ScratchBuffer prediction;
  // A prediction's steps u and u_base while it is fitted (f64, encode only).
  ScratchBuffer steps;
  // A dithered chunk's symbol contexts (one byte per element).
  ScratchBuffer symbol_contexts;
  // A first moment's residual for its low-rank term (f64, encode only).
  ScratchBuffer low_rank;

 private:
  ZSTD_CCtx_s* cctx_ = nullptr;
  ZSTD_DCtx_s* dctx_ = nullptr;
  std::unique_ptr<lossy::Scratch> lossy_;
};

}  // namespace ckptfs
