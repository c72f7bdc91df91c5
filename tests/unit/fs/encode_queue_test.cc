// The encode worker pool (fs/encode_queue.h): FIFO jobs, jobs that wait,
// and hurrying them for a sync or an unmount.
#include "fs/encode_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
#include <string>
#include <mutex>

namespace ckptfs::fs {
namespace {

using namespace std::chrono_literals;

TEST(EncodeQueueTest, DelayedJobsRunWhenDueAndCountAsPending) {
  EncodeQueue queue(2);
  std::atomic<int> ran{0};
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point ran_at;
  queue.PushAfter(200ms, [&] {
    ran_at = std::chrono::steady_clock::now();
    ++ran;
  });
  queue.Push([&] { ++ran; });
  while (ran.load() < 1) std::this_thread::sleep_for(1ms);
  if (std::chrono::steady_clock::now() - start < 150ms) {  // not on a machine too busy to tell
    EXPECT_EQ(ran.load(), 1) << "the plain job ran, the delayed one waits";
    EXPECT_EQ(queue.pending(), 1u);
  }
  EXPECT_FALSE(queue.hurry());
  while (queue.pending() != 0) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(ran.load(), 2);
  EXPECT_GE(ran_at - start, 200ms);
}

TEST(EncodeQueueTest, HurryAndDrainRunWaitingJobsAtOnce) {
  EncodeQueue queue(1);
  std::atomic<bool> hurried_inside{false};
  std::atomic<int> ran{0};
  queue.PushAfter(std::chrono::milliseconds(60'000), [&] {
    hurried_inside = queue.hurry();
    ++ran;
  });
  const auto start = std::chrono::steady_clock::now();
  queue.Hurry();
  while (queue.pending() != 0) std::this_thread::sleep_for(5ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(hurried_inside.load()) << "a hurried job sees hurry(), so it does not wait again";
  EXPECT_FALSE(queue.hurry()) << "hurry ends when the queue is idle";
  // A job that would wait again while draining runs instead.
  queue.PushAfter(std::chrono::milliseconds(60'000), [&] { ++ran; });
  queue.Drain();
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(queue.pending(), 0u);
}

TEST(EncodeQueueTest, DestructionRunsWaitingJobs) {
  std::atomic<int> ran{0};
  {
    EncodeQueue queue(1);
    queue.PushAfter(std::chrono::milliseconds(60'000), [&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 1);
}

// Background work (keeping a reconstruction) is no pending commit, runs
// ahead of the commits waiting, and Drain waits for it.
TEST(EncodeQueueTest, BackgroundJobsAreNotPendingRunFirstAndAreDrained) {
  EncodeQueue queue(1);
  std::atomic<bool> release{false};
  std::mutex mu;
  std::vector<std::string> order;
  auto note = [&](const char* what) {
    std::lock_guard lock(mu);
    order.push_back(what);
  };
  std::atomic<bool> started{false};
  queue.Push([&] {
    started = true;
    while (!release.load()) std::this_thread::sleep_for(1ms);
    note("commit 1");
  });
  while (!started.load()) std::this_thread::sleep_for(1ms);  // the worker holds it
  queue.Push([&] { note("commit 2"); });
  queue.PushBackground([&] { note("background"); });
  EXPECT_EQ(queue.pending(), 2u) << "the two commits";
  release = true;
  queue.Drain();
  EXPECT_EQ(order, (std::vector<std::string>{"commit 1", "background", "commit 2"}));
  EXPECT_EQ(queue.pending(), 0u);
  std::atomic<bool> done{false};
  queue.PushBackground([&] {
    std::this_thread::sleep_for(50ms);
    done = true;
  });
  EXPECT_EQ(queue.pending(), 0u);
  queue.Drain();
  EXPECT_TRUE(done.load()) << "Drain waited for it";
}

}  // namespace
}  // namespace ckptfs::fs
