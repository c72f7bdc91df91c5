// FolderCommits (fs/folder_commits.h): an encode waits for the encodes of
// its folder that started before it, never for later ones or other
// folders, and no longer than asked.
#include "fs/folder_commits.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace ckptfs::fs {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

TEST(FolderCommits, WaitsForEarlierEncodesOfItsFolderOnly) {
  FolderCommits commits;
  std::promise<void> entered;
  std::atomic<bool> released{false};
  std::thread holder([&] {
    FolderCommits::Entry a = commits.Enter(1);
    entered.set_value();
    std::this_thread::sleep_for(milliseconds(100));
    released = true;
  });  // `a` leaves as the thread ends
  entered.get_future().wait();
  FolderCommits::Entry b = commits.Enter(1);
  FolderCommits::Entry other = commits.Enter(2);
  // Another folder, and the earliest of a folder: no wait.
  EXPECT_FALSE(commits.WaitForEarlier(other, milliseconds(5000), nullptr));
  const auto start = Clock::now();
  EXPECT_TRUE(commits.WaitForEarlier(b, milliseconds(10000), nullptr));
  EXPECT_TRUE(released.load());
  EXPECT_GE(Clock::now() - start, milliseconds(50));
  holder.join();
  // A later entry is not waited for.
  FolderCommits::Entry later = commits.Enter(1);
  EXPECT_FALSE(commits.WaitForEarlier(b, milliseconds(5000), nullptr));
  // An entry released early (its version is a candidate) is not waited for
  // either, and its destructor leaves nothing behind.
  b.Release();
  b.Release();
  EXPECT_FALSE(commits.WaitForEarlier(later, milliseconds(5000), nullptr));
}

TEST(FolderCommits, GivesUpAtTheTimeoutOrWhenAsked) {
  FolderCommits commits;
  FolderCommits::Entry a = commits.Enter(7);
  FolderCommits::Entry b = commits.Enter(7);
  auto start = Clock::now();
  EXPECT_TRUE(commits.WaitForEarlier(b, milliseconds(120), nullptr));
  EXPECT_GE(Clock::now() - start, milliseconds(110));
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  start = Clock::now();
  int asked = 0;
  commits.WaitForEarlier(b, milliseconds(60000), [&] { return ++asked >= 3; });
  EXPECT_EQ(asked, 3);
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
}

}  // namespace
}  // namespace ckptfs::fs
