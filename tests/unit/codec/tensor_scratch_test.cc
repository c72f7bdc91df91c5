// Scratch memory (codec/tensor/scratch.h): large blocks are mappings of
// their own, aligned for huge pages, given back to the system when freed.
#include "codec/tensor/scratch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

namespace ckptfs {
namespace {

// The mapping of this process that holds `p` (/proc/self/maps), or {0, 0}.
std::pair<uintptr_t, uintptr_t> MappingOf(const void* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && at >= lo && at < hi) return {lo, hi};
  }
  return {0, 0};
}
bool Mapped(const void* p) { return MappingOf(p).second != 0; }

TEST(ScratchMemory, LargeBlocksAreMappedAndUnmappedWhenFreed) {
  for (size_t n : {ScratchBuffer::kMappedFrom, ScratchBuffer::kMappedFrom + 12345, size_t{37} << 20}) {
    ScratchBuffer::Memory m = ScratchBuffer::AllocateLarge(n);
    ASSERT_NE(m.get(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.get()) % 4096, 0u) << n;
    EXPECT_GE(m.get_deleter().mapped, n);
    EXPECT_LT(m.get_deleter().mapped, n + 4096);
    EXPECT_TRUE(Mapped(m.get()));
    std::memset(m.get(), 0x5a, n);  // all of it writable
    const std::byte* last = m.get() + n - 1;
    EXPECT_EQ(*last, std::byte{0x5a});
    m.reset();
    EXPECT_FALSE(Mapped(last)) << "freed memory goes back to the system (" << n << " bytes)";
  }
  // Small blocks come from malloc.
  ScratchBuffer::Memory small = ScratchBuffer::AllocateLarge(1000);
  ASSERT_NE(small.get(), nullptr);
  EXPECT_EQ(small.get_deleter().mapped, 0u);
  ScratchBuffer buffer;
  std::byte* p = buffer.Reserve(size_t{9} << 20);
  p[(size_t{9} << 20) - 1] = std::byte{1};
  EXPECT_EQ(buffer.Reserve(100), p) << "a smaller request keeps the block";
  // A moved-from buffer is empty: its next Reserve allocates.
  ScratchBuffer taken = std::move(buffer);
  EXPECT_EQ(taken.data(), p);
  EXPECT_EQ(buffer.capacity(), 0u);  // NOLINT(bugprone-use-after-move): what this checks
  std::byte* again = buffer.Reserve(64);
  ASSERT_NE(again, nullptr);
  again[63] = std::byte{2};
}

}  // namespace
}  // namespace ckptfs
