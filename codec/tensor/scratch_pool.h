// A shared free list of CodecScratch for readers. A decode leases one for
// its duration and gives it back, so the scratch memory (already faulted
// in) is reused by whichever thread decodes next, instead of every request
// thread of the daemon growing its own buffers (fresh pages fault on first
// touch: a large share of a cold read's time).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "codec/tensor/scratch.h"

namespace ckptfs {

// Thread safety: Acquire and the leases' destructors are thread-safe.
class CodecScratchPool {
 public:
  // Keeps up to `max_idle` scratches between decodes, or up to as many as
  // were lent at once since the last Trim when that is more (at most
  // kMaxKept): a chain decode leases one per level, all at once, so a
  // chain deeper than max_idle made and freed the deeper levels' scratches
  // (zstd contexts, lossy buffers) for every chunk it decoded. The peak of
  // memory is the same either way (those leases are alive together).
  explicit CodecScratchPool(size_t max_idle = 4) : max_idle_(max_idle) {}
  CodecScratchPool(const CodecScratchPool&) = delete;
  CodecScratchPool& operator=(const CodecScratchPool&) = delete;

  // A scratch lent until destruction. Moves only. The pool must outlive it.
  class Lease {
   public:
    Lease(CodecScratchPool* pool, std::unique_ptr<CodecScratch> scratch)
        : pool_(pool), scratch_(std::move(scratch)) {}
    Lease(Lease&& o) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (scratch_) pool_->GiveBack(std::move(scratch_));
    }
    CodecScratch& operator*() const { return *scratch_; }
    CodecScratch* operator->() const { return scratch_.get(); }

   private:
    CodecScratchPool* pool_;
    std::unique_ptr<CodecScratch> scratch_;
  };

  // An idle scratch (the most recently used: its memory is the warmest),
  // or a new one.
  Lease Acquire();

  // Frees idle scratches beyond `keep` (the least recently used first):
  // an idle reader keeps little of the memory its busiest moment needed.
  // Forgets the peak of leases before it.
  void Trim(size_t keep);

  // Idle scratches kept now (tests).
  size_t idle() const;

 private:
  void GiveBack(std::unique_ptr<CodecScratch> scratch);

  static constexpr size_t kMaxKept = 64;

  const size_t max_idle_;
  mutable std::mutex mu_;  // leaf lock; guards everything below
  size_t lent_ = 0;        // leases alive now
  size_t peak_lent_ = 0;   // the most alive at once since the last Trim
  std::vector<std::unique_ptr<CodecScratch>> idle_;
};

}  // namespace ckptfs
