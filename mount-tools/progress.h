// A progress line on stderr for the long commands (restore, decode, encode,
// fsck): drawn only when stderr is a terminal and --quiet was not given, so
// pipes, logs and --json output never see it. A ticker thread redraws it a
// few times a second from an atomic counter the work thread advances.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace ckptfs::tools {

// Whether a command should draw progress: stderr is a terminal and not quiet.
bool ProgressWanted(bool quiet);

class Progress {
 public:
  // `total`: the amount of work in `unit`s ("bytes" are shown in MB), 0 if
  // unknown (then only the amount done and the time are shown); an empty
  // unit shows the time alone.
  Progress(std::string label, uint64_t total, std::string unit, bool enabled);
  ~Progress() { Finish(); }
  // Stops drawing and erases the line (before the command prints its result).
  void Finish();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t n) { done_.fetch_add(n, std::memory_order_relaxed); }

 private:
  void Run();
  void Draw();

  const std::string label_;
  const uint64_t total_;
  const std::string unit_;
  const bool enabled_;
  // Between draws (the first after one interval): 250 ms, or
  // CKPTFS_PROGRESS_MS (tests, whose commands may finish within 250 ms).
  const std::chrono::milliseconds interval_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread ticker_;
};

}  // namespace ckptfs::tools
