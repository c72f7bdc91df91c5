// Files written and read around the page cache (fs/direct_file.h): every
// byte comes back, whatever the alignment of the memory, the offsets and
// the sizes, on a filesystem that takes O_DIRECT and on one that may not.
#include "fs/direct_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::RandomBytes;
using testing::TempDir;

constexpr size_t kAlign = BounceWindows::kAlign;

int OpenEmpty(const std::string& dir) {
  const std::string path = dir + "/direct-file-test";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ::unlink(path.c_str());
  return fd;
}

// Writes `size` bytes starting `misalign` bytes into an aligned buffer, then
// reads back ranges of every kind into aligned and unaligned memory.
void RoundTrip(const std::string& dir, size_t size, size_t misalign, uint32_t seed) {
  SCOPED_TRACE("size " + std::to_string(size) + " misalign " + std::to_string(misalign) + " in " + dir);
  const std::vector<std::byte> bytes = RandomBytes(size, seed);
  ScratchBuffer source;
  std::byte* at = source.Reserve(size + misalign + kAlign);
  at += (kAlign - reinterpret_cast<uintptr_t>(at) % kAlign) % kAlign + misalign;
  std::copy(bytes.begin(), bytes.end(), at);
  auto windows = std::make_shared<BounceWindows>();
  const int fd = OpenEmpty(dir);
  ASSERT_GE(fd, 0);
  auto file = DirectFile::Write(fd, ByteSpan(at, size), "test file", windows);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->Size(), size);
  EXPECT_EQ(std::filesystem::file_size("/proc/self/fd/" + std::to_string(fd)), size) << "no padding left";

  std::mt19937 rng(seed);
  ScratchBuffer target;
  std::byte* aligned = target.Reserve(size + 2 * kAlign);
  aligned += (kAlign - reinterpret_cast<uintptr_t>(aligned) % kAlign) % kAlign;
  std::vector<std::pair<uint64_t, size_t>> ranges = {{0, size}, {0, std::min<size_t>(size, 1)}};
  if (size > kAlign) ranges.emplace_back(kAlign, size - kAlign);
  if (size > 1) ranges.emplace_back(size - 1, 1);
  for (int i = 0; i < 40; ++i) {
    const uint64_t offset = rng() % size;
    ranges.emplace_back(offset, rng() % (size - offset) + 1);
  }
  for (auto [offset, length] : ranges) {
    for (size_t shift : {size_t{0}, size_t{1}, size_t{513}}) {
      std::byte* out = aligned + shift;
      std::fill_n(out, length, std::byte{0xee});
      ASSERT_TRUE((*file)->ReadAt(offset, MutableByteSpan(out, length)).ok()) << offset << "+" << length;
      ASSERT_TRUE(std::equal(out, out + length, bytes.begin() + static_cast<ptrdiff_t>(offset)))
          << offset << "+" << length << " into memory at +" << shift;
    }
  }
  std::byte one[2];
  EXPECT_FALSE((*file)->ReadAt(size - 1, MutableByteSpan(one, 2)).ok()) << "past the end";
  EXPECT_FALSE((*file)->ReadAt(size + 1, MutableByteSpan(one, 0)).ok()) << "past the end";
  EXPECT_LE(windows->idle(), BounceWindows::kMaxIdle) << "windows go back";
}

TEST(DirectFile, ReadsBackEveryRangeOfWhatItWrote) {
  TempDir dir;
  const size_t sizes[] = {1, kAlign - 1, kAlign, kAlign + 1, 3 * kAlign + 17, BounceWindows::kBytes + 5,
                          2 * BounceWindows::kBytes + kAlign};
  uint32_t seed = 1;
  for (size_t size : sizes)
    for (size_t misalign : {size_t{0}, size_t{8}})
      RoundTrip(dir.path(), size, misalign, seed++);
}

TEST(DirectFile, WorksWhereTheFilesystemMayRefuseDirectTransfers) {
  // tmpfs refuses O_DIRECT on older kernels (and takes it on newer ones):
  // either way the bytes come back.
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm on this machine";
  RoundTrip("/dev/shm", 3 * kAlign + 17, 8, 7);
  RoundTrip("/dev/shm", BounceWindows::kBytes + 5, 0, 8);
}

TEST(DirectFile, GoesAroundThePageCacheOnADisk) {
  TempDir dir;
  const int fd = OpenEmpty(dir.path());
  ASSERT_GE(fd, 0);
  const size_t size = 64 * kAlign + 100;  // a padded tail too
  const std::vector<std::byte> bytes = RandomBytes(size, 9);
  auto file = DirectFile::Write(fd, bytes, "test file", std::make_shared<BounceWindows>());
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  if (!(*file)->direct()) GTEST_SKIP() << "the test directory's filesystem refuses O_DIRECT";
  std::vector<std::byte> out(size);
  ASSERT_TRUE((*file)->ReadAt(0, out).ok());
  ASSERT_EQ(out, bytes);
  // Neither the write nor the read left the file's pages in the page
  // cache (a mapping shows what is resident without faulting it in).
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  const size_t pages = (size + kAlign - 1) / kAlign;
  std::vector<unsigned char> resident(pages);
  ASSERT_EQ(::mincore(map, size, resident.data()), 0);
  ::munmap(map, size);
  EXPECT_EQ(std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1) != 0; }), 0);
}

}  // namespace
}  // namespace ckptfs::fs
