#include "fs/memory_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "fs/options.h"

namespace ckptfs::fs {
namespace {

TEST(MemoryBudgetTest, ReservationWaitsUntilItFits) {
  MemoryBudget budget(100);
  auto a = std::make_unique<MemoryBudget::Reservation>(budget.Reserve(60));
  std::atomic<bool> got{false};
  std::thread t([&] {
    MemoryBudget::Reservation b = budget.Reserve(60);  // 120 > 100: waits for `a`
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load());
  EXPECT_EQ(budget.in_use(), 60u);
  a.reset();
  t.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_EQ(budget.waits(), 1u);
}

TEST(MemoryBudgetTest, OversizedReservationRunsAlone) {
  MemoryBudget budget(100);
  { MemoryBudget::Reservation big = budget.Reserve(1000); EXPECT_EQ(budget.in_use(), 1000u); }
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_EQ(budget.waits(), 0u);
}

TEST(MemoryBudgetTest, ZeroCapacityIsUnbounded) {
  MemoryBudget budget(0);
  MemoryBudget::Reservation a = budget.Reserve(1ull << 40), b = budget.Reserve(1ull << 40);
  EXPECT_EQ(budget.in_use(), 0u);
}

TEST(MemoryBudgetTest, MemOptionSplitsBetweenCacheAndEncodes) {
  MountOptions o;
  ASSERT_TRUE(ParseMountOptionList("mem=256", &o).ok());
  EXPECT_EQ(o.mem_mib, 256u);
  MemorySplit split = SplitMemory(o);
  EXPECT_EQ(split.cache_mib, 128u);
  EXPECT_EQ(split.encode_mib, 128u);
  ASSERT_TRUE(ParseMountOptionList("mem=1000,cache=64", &o).ok());
  EXPECT_EQ(SplitMemory(o).cache_mib, 64u);  // cache= stays the cache's own cap
  EXPECT_EQ(SplitMemory(o).encode_mib, 936u);
  MountOptions unbounded;
  EXPECT_EQ(SplitMemory(unbounded).cache_mib, 256u);
  EXPECT_EQ(SplitMemory(unbounded).encode_mib, 0u);
  // Room for a stream's awaited chunks beside the cache, only without mem=.
  EXPECT_EQ(SplitMemory(unbounded).awaited_mib, kAwaitedPerCache * 256u);
  EXPECT_EQ(SplitMemory(o).awaited_mib, 0u);
  EXPECT_EQ(ParseMountOptionList("mem=x", &o).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckptfs::fs
