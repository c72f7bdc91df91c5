// The memory bound of mount option mem=MiB: a byte budget that encodes
// reserve their estimated working set from before they start. An encode
// whose reservation does not fit waits until running ones finish; one that
// is larger than the whole budget runs when nothing else holds any (so a
// file is never refused, only serialized).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace ckptfs::fs {

// The machine's memory in bytes (0 when the system does not say).
uint64_t PhysicalMemoryBytes();

// Thread safety: all methods are thread-safe.
class MemoryBudget {
 public:
  // `capacity_bytes` 0: unbounded (Reserve never waits).
  explicit MemoryBudget(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Bytes held until destruction. Moves only.
  class Reservation {
   public:
    Reservation(MemoryBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    Reservation(Reservation&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.budget_ = nullptr; }
    Reservation& operator=(Reservation&&) = delete;
    ~Reservation();
    uint64_t bytes() const { return bytes_; }

   private:
    MemoryBudget* budget_;
    uint64_t bytes_;
  };

  // Blocks until `bytes` fit (or nothing is reserved), then holds them.
  Reservation Reserve(uint64_t bytes);
  uint64_t capacity() const { return capacity_; }
  uint64_t in_use();
  // Reservations that had to wait so far (reported in the log at exit).
  uint64_t waits();

 private:
  void Release(uint64_t bytes);

  const uint64_t capacity_;
  std::mutex mu_;  // leaf lock
  std::condition_variable cv_;
  uint64_t in_use_ = 0;
  uint64_t waits_ = 0;
};

}  // namespace ckptfs::fs
