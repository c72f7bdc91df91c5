// Scratch memory (codec/tensor/scratch.h): large blocks are mappings of
// their own, page-aligned, given back to the system when freed, with their
// pages mapped when made or when their writer asks (PopulateForWrite).
#include "codec/tensor/scratch.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

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

// How many of the pages of [p, p + n) (page-aligned) are resident.
size_t ResidentPages(const std::byte* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((n + page - 1) / page);
  if (::mincore(const_cast<std::byte*>(p), n, in.data()) != 0) return SIZE_MAX;
  size_t count = 0;
  for (unsigned char c : in) count += c & 1;
  return count;
}

TEST(ScratchMemory, PagesAreMappedWhenMadeOrWhenTheWriterAsks) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t n = size_t{16} << 20, pages = n / page;
  ScratchBuffer::Memory populated = ScratchBuffer::AllocateLarge(n);
  EXPECT_EQ(ResidentPages(populated.get(), n), pages) << "mapped with its pages";
  ScratchBuffer::Memory lazy = ScratchBuffer::AllocateLarge(n, ScratchBuffer::Pages::kOnFirstTouch);
  EXPECT_EQ(ResidentPages(lazy.get(), n), 0u) << "no page before its first write";
  // A writer's part, not page-aligned: the pages under it, none far from
  // it (a system that puts every mapping in 2 MiB pages may fill the huge
  // pages around it).
  const size_t huge = size_t{2} << 20;
  const size_t from = 2 * huge + 3 * page + 100, length = (size_t{6} << 20) - 200;
  {
    // Whether this kernel has the advice (Linux 5.14 on), asked of a mapping of its own.
    void* probe = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    const bool supported = ::madvise(probe, page, MADV_POPULATE_WRITE) == 0;
    ::munmap(probe, page);
    if (!supported) GTEST_SKIP() << "MADV_POPULATE_WRITE not supported by this kernel";
  }
  ScratchBuffer::PopulateForWrite(MutableByteSpan(lazy.get() + from, length));
  const size_t first = from / page, end = (from + length + page - 1) / page;
  EXPECT_EQ(ResidentPages(lazy.get() + first * page, (end - first) * page), end - first);
  EXPECT_EQ(ResidentPages(lazy.get(), huge), 0u);
  const size_t after = (end * page + 2 * huge - 1) / huge * huge;  // past the huge page holding the end, and one more
  ASSERT_LT(after, n);
  EXPECT_EQ(ResidentPages(lazy.get() + after, n - after), 0u);
  // A part too small to be worth the call is left to its writes.
  ScratchBuffer::PopulateForWrite(MutableByteSpan(lazy.get() + n - 2 * page, page));
  EXPECT_EQ(ResidentPages(lazy.get() + after, n - after), 0u);
}

// A buffer reserved for a view's fallback takes no memory until written;
// an ordinary reservation is mapped whole.
TEST(ScratchMemory, AFallbackBufferIsMappedOnlyWhereWritten) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t n = size_t{8} << 20;
  ScratchBuffer fallback;
  std::byte* p = fallback.ReserveForFallback(n);
  EXPECT_EQ(ResidentPages(p, n), 0u) << "no page before a write";
  p[0] = std::byte{1};
  EXPECT_EQ(ResidentPages(p + n / 2, n / 2), 0u) << "only the written pages";
  ScratchBuffer ordinary;
  EXPECT_EQ(ResidentPages(ordinary.Reserve(n), n), n / page);
}

}  // namespace
}  // namespace ckptfs
