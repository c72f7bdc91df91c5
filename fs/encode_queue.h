// The encode worker pool: commits run here, never on a FUSE request thread.
#pragma once

#include <chrono>
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
  // Queues `job` to run once `delay` has passed, or at once while the
  // queue drains (Drain, destruction): a job that waits for something
  // (a DCP shard for its save's .metadata) never holds up an unmount.
  void PushAfter(std::chrono::milliseconds delay, std::function<void()> job);
  // Queues `job`, work that is no commit (keeping a reconstruction), ahead
  // of the commits waiting (it holds memory until it runs): pending()
  // leaves it out, and once the queue drains or stops (Drain, the
  // destructor: the daemon is about to exit) it is dropped unrun. It must
  // not wait for anything the queue's other jobs hold.
  void PushBackground(std::function<void()> job);
  // Blocks until no job is queued, waiting or running.
  void Drain();
  // Waiting jobs are due now, and hurry() holds until the queue is idle
  // (`ckptfs sync` and umount ask for this: they wait for every commit).
  void Hurry();
  // True while Drain, Hurry or the destructor waits: jobs should not wait
  // for anything now.
  bool hurry();
  // Jobs queued, waiting or running, but for background ones.
  uint64_t pending();
  // True while Drain or the destructor waits (not for Hurry alone).
  bool stopping();

 private:
  void Work();

  std::mutex mu_;  // leaf lock
  std::condition_variable work_cv_, idle_cv_;
  struct Job {
    std::function<void()> run;
    bool background = false;
  };
  std::deque<Job> jobs_;
  uint64_t background_ = 0;  // background jobs queued or running
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::function<void()>>> delayed_;
  uint64_t running_ = 0;
  unsigned draining_ = 0;
  bool urgent_ = false;  // Hurry() until the queue is next idle
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ckptfs::fs
