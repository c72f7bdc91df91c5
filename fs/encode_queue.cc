#include "fs/encode_queue.h"

#include <algorithm>

namespace ckptfs::fs {

EncodeQueue::EncodeQueue(unsigned threads) {
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

EncodeQueue::~EncodeQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void EncodeQueue::Push(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(Job{std::move(job)});
  }
  work_cv_.notify_one();
}

void EncodeQueue::PushBackground(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_front(Job{std::move(job), true});
    ++background_;
  }
  work_cv_.notify_one();
}

void EncodeQueue::PushAfter(std::chrono::milliseconds delay, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    delayed_.emplace_back(std::chrono::steady_clock::now() + delay, std::move(job));
  }
  work_cv_.notify_one();
}

void EncodeQueue::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  ++draining_;
  work_cv_.notify_all();  // waiting jobs are due now
  idle_cv_.wait(lock, [this] { return jobs_.empty() && delayed_.empty() && running_ == 0; });
  --draining_;
}

void EncodeQueue::Hurry() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.empty() && delayed_.empty() && running_ == 0) return;
    urgent_ = true;
  }
  work_cv_.notify_all();
}

bool EncodeQueue::hurry() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_ || draining_ > 0 || urgent_;
}

bool EncodeQueue::stopping() {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_ || draining_ > 0;
}

uint64_t EncodeQueue::pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size() + delayed_.size() + running_ - background_;
}

void EncodeQueue::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // Waiting jobs whose time has come (all of them when hurrying) join
    // the queue, in the order they were pushed.
    const auto now = std::chrono::steady_clock::now();
    const bool hurrying = stop_ || draining_ > 0 || urgent_;
    for (auto it = delayed_.begin(); it != delayed_.end();) {
      if (hurrying || it->first <= now) {
        jobs_.push_back(Job{std::move(it->second)});
        it = delayed_.erase(it);
      } else {
        ++it;
      }
    }
    if (jobs_.empty()) {
      if (stop_ && delayed_.empty()) return;  // nothing left to run
      if (delayed_.empty()) {
        work_cv_.wait(lock);
      } else {
        auto due = delayed_.front().first;
        for (const auto& d : delayed_) due = std::min(due, d.first);
        work_cv_.wait_until(lock, due);
      }
      continue;
    }
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    if (job.background && (stop_ || draining_ > 0)) {
      // The daemon is about to exit: what the job would keep goes with it.
      --background_;
      lock.unlock();
      job.run = nullptr;  // what it holds is freed outside the lock
      lock.lock();
      if (jobs_.empty() && delayed_.empty() && running_ == 0) {
        urgent_ = false;
        idle_cv_.notify_all();
      }
      continue;
    }
    ++running_;
    lock.unlock();
    job.run();
    job.run = nullptr;  // what it holds goes before it stops counting
    lock.lock();
    --running_;
    if (job.background) --background_;
    if (jobs_.empty() && delayed_.empty() && running_ == 0) {
      urgent_ = false;
      idle_cv_.notify_all();
    }
  }
}

}  // namespace ckptfs::fs
