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
  // The plain job counts as pending until it returns, a moment after it
  // counted itself as run (it failed under ASan once without this wait).
  while (queue.pending() > 1 && std::chrono::steady_clock::now() - start < 150ms) std::this_thread::sleep_for(1ms);
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

// Background work (keeping a reconstruction) is no pending commit and
// runs ahead of the commits waiting.
TEST(EncodeQueueTest, BackgroundJobsAreNotPendingAndRunFirst) {
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
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (order.size() == 3) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"commit 1", "background", "commit 2"}));
  // "commit 2" is noted before its job returns, and the job counts as
  // pending until then.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (queue.pending() != 0u && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(queue.pending(), 0u);
}

// A reconstruction queued when the daemon is about to exit is dropped
// unrun: the spill goes with the daemon.
TEST(EncodeQueueTest, DrainDropsQueuedBackgroundJobs) {
  EncodeQueue queue(1);
  std::atomic<bool> release{false}, started{false}, background_ran{false}, commit_ran{false};
  queue.Push([&] {
    started = true;
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  while (!started.load()) std::this_thread::sleep_for(1ms);
  queue.PushBackground([&] { background_ran = true; });
  queue.Push([&] { commit_ran = true; });
  EXPECT_FALSE(queue.stopping());
  queue.Hurry();
  EXPECT_FALSE(queue.stopping()) << "a sync is no stop";
  std::thread drain([&] { queue.Drain(); });
  while (!queue.stopping()) std::this_thread::sleep_for(1ms);
  release = true;
  drain.join();
  EXPECT_TRUE(commit_ran.load()) << "commits still run";
  EXPECT_FALSE(background_ran.load());
  EXPECT_EQ(queue.pending(), 0u);
  EXPECT_FALSE(queue.stopping());
}

}  // namespace
}  // namespace ckptfs::fs
