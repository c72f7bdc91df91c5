// ForEachUserFile and OpenNoAtime (fs/store.h): the walk that recovery, GC
// and fsck share lists the user's regular files and leaves the atimes of
// the user's directories and files alone.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fs/store.h"
#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::TempDir;

void Touch(const std::string& path) { std::ofstream(path) << "x"; }

// atime before mtime: a relatime mount would move it on the next read.
void OldAtime(const std::string& path) {
  const struct timespec times[2] = {{1'000'000'000, 0}, {1'100'000'000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

long Atime(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_atim.tv_sec;
}

TEST(ForEachUserFile, ListsRegularFilesSkipsStoreAndSymlinks) {
  TempDir dir;
  const std::string& root = dir.path();
  std::filesystem::create_directories(root + "/a/b");
  std::filesystem::create_directories(root + "/" + std::string(kMetaDirName) + "/objects");
  std::filesystem::create_directories(root + "/a/" + std::string(kMetaDirName));  // only the root's is the store
  Touch(root + "/top");
  Touch(root + "/a/b/deep");
  Touch(root + "/a/" + std::string(kMetaDirName) + "/user");
  Touch(root + "/" + std::string(kMetaDirName) + "/objects/obj");
  ASSERT_EQ(::symlink("top", (root + "/link").c_str()), 0);
  ASSERT_EQ(::symlink("a", (root + "/dirlink").c_str()), 0);
  ASSERT_EQ(::mkfifo((root + "/fifo").c_str(), 0644), 0);
  std::vector<std::string> seen;
  ASSERT_TRUE(ForEachUserFile(root, [&](const std::string& rel) { seen.push_back(rel); }).ok());
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"a/.ckptfs/user", "a/b/deep", "top"}));
}

TEST(ForEachUserFile, MissingRootIsAnError) {
  EXPECT_FALSE(ForEachUserFile("/nonexistent/ckptfs-walk", [](const std::string&) {}).ok());
}

TEST(ForEachUserFile, LeavesDirectoryAndFileAtimes) {
  TempDir dir;
  const std::string& root = dir.path();
  std::filesystem::create_directories(root + "/d/e");
  Touch(root + "/d/e/f");
  for (const char* rel : {"/d", "/d/e", "/d/e/f"}) OldAtime(root + rel);
  ASSERT_TRUE(ForEachUserFile(root, [&](const std::string& rel) {
                int fd = OpenNoAtime(AT_FDCWD, (root + "/" + rel).c_str(), O_RDONLY | O_CLOEXEC);
                ASSERT_GE(fd, 0);
                char c;
                EXPECT_EQ(::read(fd, &c, 1), 1);
                ::close(fd);
              }).ok());
  for (const char* rel : {"/d", "/d/e", "/d/e/f"}) EXPECT_EQ(Atime(root + rel), 1'000'000'000) << rel;
}

}  // namespace
}  // namespace ckptfs::fs
