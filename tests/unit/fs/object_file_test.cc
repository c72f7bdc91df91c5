// ObjectFile: views of the mapped bytes equal what pread reads; a range
// that cannot be read (the file was cut short under the reader) gives an
// empty view and a pread error instead of SIGBUS.
#include "fs/object_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::RandomBytes;
using testing::TempDir;

std::string WriteFile(const TempDir& dir, const std::string& name, const std::vector<std::byte>& bytes) {
  std::string path = dir.path() + "/" + name;
  EXPECT_TRUE(WriteWholeFile(path, bytes).ok());
  return path;
}

TEST(ObjectFileTest, ViewsEqualTheBytesAtEveryOffset) {
  TempDir dir;
  std::vector<std::byte> bytes = RandomBytes(3 * 4096 + 123, 1);
  auto file = ObjectFile::Open(WriteFile(dir, "obj", bytes));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->Size(), bytes.size());
  for (uint64_t offset : {0ul, 1ul, 4095ul, 4096ul, 8000ul, bytes.size() - 1}) {
    for (uint64_t length : {1ul, 100ul, 4096ul, 9000ul}) {
      if (offset + length > bytes.size()) continue;
      ByteSpan view = (*file)->View(offset, length);
      ASSERT_EQ(view.size(), length) << offset << "+" << length;
      EXPECT_TRUE(std::equal(view.begin(), view.end(), bytes.begin() + offset)) << offset << "+" << length;
      (*file)->EndView(view);
      std::vector<std::byte> copy(length);
      ASSERT_TRUE((*file)->ReadAt(offset, copy).ok());
      EXPECT_TRUE(std::equal(copy.begin(), copy.end(), bytes.begin() + offset));
    }
  }
  // A view ended by a neighbour (pages shared at the edges) still reads.
  ByteSpan a = (*file)->View(0, 5000), b = (*file)->View(5000, 3000);
  (*file)->EndView(a);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), bytes.begin() + 5000));
  (*file)->EndView(b);
  EXPECT_TRUE((*file)->View(bytes.size() - 10, 11).empty());  // past the end
}

TEST(ObjectFileTest, AFileCutShortGivesNoViewAndAReadError) {
  TempDir dir;
  std::vector<std::byte> bytes = RandomBytes(5 * 4096, 2);
  std::string path = WriteFile(dir, "obj", bytes);
  auto file = ObjectFile::Open(path);
  ASSERT_TRUE(file.ok());
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  EXPECT_EQ((*file)->View(0, 100).size(), 100u);  // still there
  EXPECT_TRUE((*file)->View(2 * 4096, 100).empty());
  std::vector<std::byte> copy(100);
  EXPECT_FALSE((*file)->ReadAt(2 * 4096, copy).ok());
}

TEST(ObjectFileTest, EmptyFilesAndSymbolicLinks) {
  TempDir dir;
  auto empty = ObjectFile::Open(WriteFile(dir, "empty", {}));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)->Size(), 0u);
  EXPECT_TRUE((*empty)->View(0, 0).empty());
  std::string target = WriteFile(dir, "target", RandomBytes(10, 3));
  std::filesystem::create_symlink(target, dir.path() + "/link");
  auto link = ObjectFile::Open(dir.path() + "/link");
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().sys_errno(), ELOOP);
}

}  // namespace
}  // namespace ckptfs::fs
