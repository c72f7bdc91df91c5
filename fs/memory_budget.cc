#include "fs/memory_budget.h"

#include <unistd.h>

namespace ckptfs::fs {

uint64_t PhysicalMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

MemoryBudget::Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->Release(bytes_);
}

MemoryBudget::Reservation MemoryBudget::Reserve(uint64_t bytes) {
  if (capacity_ == 0) return Reservation(nullptr, bytes);
  std::unique_lock<std::mutex> lock(mu_);
  auto fits = [&] { return in_use_ == 0 || in_use_ + bytes <= capacity_; };
  if (!fits()) {
    ++waits_;
    cv_.wait(lock, fits);
  }
  in_use_ += bytes;
  return Reservation(this, bytes);
}

void MemoryBudget::Release(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= bytes;
  }
  cv_.notify_all();
}

uint64_t MemoryBudget::in_use() {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

uint64_t MemoryBudget::waits() {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_;
}

}  // namespace ckptfs::fs
