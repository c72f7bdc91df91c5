#include "codec/tensor/scratch_pool.h"

#include <algorithm>

namespace ckptfs {

CodecScratchPool::Lease CodecScratchPool::Acquire() {
  std::unique_ptr<CodecScratch> scratch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      scratch = std::move(idle_.back());
      idle_.pop_back();
    }
    ++lent_;
    peak_lent_ = std::max(peak_lent_, lent_);
  }
  if (!scratch) {
    try {
      scratch = std::make_unique<CodecScratch>();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      --lent_;
      throw;
    }
  }
  return Lease(this, std::move(scratch));
}

void CodecScratchPool::GiveBack(std::unique_ptr<CodecScratch> scratch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --lent_;
    if (idle_.size() < std::min(std::max(max_idle_, peak_lent_), kMaxKept)) {
      idle_.push_back(std::move(scratch));
      return;
    }
  }
  // Freed outside the lock (a scratch may hold many MiB).
  scratch.reset();
}

void CodecScratchPool::Trim(size_t keep) {
  std::vector<std::unique_ptr<CodecScratch>> freed;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    peak_lent_ = lent_;  // from now on, what the next busy moment needs
    if (idle_.size() <= keep) return;
    const auto cut = idle_.begin() + static_cast<std::ptrdiff_t>(idle_.size() - keep);
    freed.assign(std::make_move_iterator(idle_.begin()), std::make_move_iterator(cut));
    idle_.erase(idle_.begin(), cut);
  }
}

size_t CodecScratchPool::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_.size();
}

}  // namespace ckptfs
