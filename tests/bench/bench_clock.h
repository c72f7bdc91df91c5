// The clocks the benchmarks time with. On a shared machine wall time mostly
// measures the neighbours; the calling thread's CPU time does not, and
// every measured call runs on the calling thread (one-thread benchmarks).
// A GPU backend works outside the thread: time it by the wall clock.
#pragma once

#include <time.h>

#include <chrono>

namespace ckptfs::bench {

enum class ClockKind { kWall, kThreadCpu };

inline double NowSeconds(ClockKind kind) {
  if (kind == ClockKind::kThreadCpu) {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace ckptfs::bench
