// EntrySyncs (fs/entry_syncs.h): which folder fsyncs make new entries
// durable, and which are covered by one that already ran.
#include "fs/entry_syncs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {

using testing::TempDir;

struct stat StatOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st;
}

TEST(EntrySyncs, OneFsyncCoversTheEntriesMadeBeforeItStarted) {
  TempDir dir;
  EntrySyncs syncs;
  const uint64_t a = syncs.EntryMade(), b = syncs.EntryMade();
  ASSERT_TRUE(syncs.Sync(dir.path(), a).ok());
  EXPECT_EQ(syncs.folder_fsyncs(), 1u);
  ASSERT_TRUE(syncs.Sync(dir.path(), b).ok());  // made before that fsync started
  EXPECT_EQ(syncs.folder_fsyncs(), 1u);
  const uint64_t c = syncs.EntryMade();  // made after it
  ASSERT_TRUE(syncs.Sync(dir.path(), c).ok());
  EXPECT_EQ(syncs.folder_fsyncs(), 2u);
}

TEST(EntrySyncs, CoverageIsPerFolder) {
  TempDir dir;
  const std::string other = dir.path() + "/other";
  ASSERT_EQ(::mkdir(other.c_str(), 0755), 0);
  EntrySyncs syncs;
  const uint64_t a = syncs.EntryMade();
  ASSERT_TRUE(syncs.Sync(dir.path(), syncs.EntryMade()).ok());
  ASSERT_TRUE(syncs.Sync(other, a).ok());  // the first folder's fsync says nothing of this one
  EXPECT_EQ(syncs.folder_fsyncs(), 2u);
}

TEST(EntrySyncs, ANewFolderIsSyncedInItsParentWithItsFirstEntry) {
  TempDir dir;
  const std::string step = dir.path() + "/step-1", inner = step + "/inner";
  ASSERT_EQ(::mkdir(step.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(inner.c_str(), 0755), 0);
  EntrySyncs syncs;
  struct stat s = StatOf(step), i = StatOf(inner);
  syncs.FolderMade(s.st_dev, s.st_ino);
  syncs.FolderMade(i.st_dev, i.st_ino);
  const uint64_t f = syncs.EntryMade();
  ASSERT_TRUE(syncs.Sync(inner, f).ok());
  EXPECT_EQ(syncs.folder_fsyncs(), 3u);  // inner (the file), step-1 (inner's entry), the root (step-1's)
  // Both folders' entries are durable now: a later file costs its folder only.
  const uint64_t g = syncs.EntryMade();
  ASSERT_TRUE(syncs.Sync(inner, g).ok());
  EXPECT_EQ(syncs.folder_fsyncs(), 4u);
}

TEST(EntrySyncs, AMovedFolderIsNewInItsNewParent) {
  TempDir dir;
  const std::string a = dir.path() + "/a", b = dir.path() + "/b", sub = a + "/sub";
  ASSERT_EQ(::mkdir(a.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(b.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  EntrySyncs syncs;
  struct stat st = StatOf(sub);
  syncs.FolderMade(st.st_dev, st.st_ino);
  ASSERT_TRUE(syncs.Sync(b, syncs.EntryMade()).ok());  // b synced for something else
  const uint64_t before = syncs.folder_fsyncs();
  const std::string moved = b + "/sub";
  ASSERT_EQ(::rename(sub.c_str(), moved.c_str()), 0);
  syncs.FolderMoved(st.st_dev, st.st_ino);  // its entry in b is newer than b's fsync
  ASSERT_TRUE(syncs.Sync(moved, syncs.EntryMade()).ok());
  EXPECT_EQ(syncs.folder_fsyncs(), before + 2);  // sub, then b again
}

TEST(EntrySyncs, AFolderThatCannotBeOpenedIsAnErrorAndCoversNothing) {
  TempDir dir;
  EntrySyncs syncs;
  const uint64_t t = syncs.EntryMade();
  Status s = syncs.Sync(dir.path() + "/missing", t);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.sys_errno(), ENOENT);
  EXPECT_EQ(syncs.folder_fsyncs(), 0u);
}

}  // namespace
}  // namespace ckptfs::fs
