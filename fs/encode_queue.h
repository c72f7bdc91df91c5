// The encode worker pool: commits run here, never on a FUSE request thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ckptfs::fs {

// A fixed pool of worker threads running queued jobs in FIFO order.
// Thread safety: all methods are thread-safe.
class EncodeQueue {
 public:
  explicit EncodeQueue(unsigned threads);
  // Runs every queued job, then joins the workers.
  ~EncodeQueue();
  EncodeQueue(const EncodeQueue&) = delete;
  EncodeQueue& operator=(const EncodeQueue&) = delete;

  void Push(std::function<void()> job);
  // Blocks until no job is queued or running.
  void Drain();
  // Jobs queued or running.
  uint64_t pending();

 private:
  void Work();

  std::mutex mu_;  // leaf lock
  std::condition_variable work_cv_, idle_cv_;
  std::deque<std::function<void()>> jobs_;
  uint64_t running_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckptfs::fs
