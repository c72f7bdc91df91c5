#include "fs/gc.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <string>

#include "fs/commit_pipeline.h"
#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::RandomBytes;
using testing::TempDir;

struct Committed {
  EncodedVersion version;
  std::string path;
};

Committed Commit(Store& store, const std::string& path, const std::vector<std::byte>& bytes,
                 const std::vector<BaseCandidate>& candidates) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  EXPECT_GE(fd, 0);
  EXPECT_TRUE(InitEmptyManifest(fd, false).ok());
  Manifest m;
  m.sequence = 2;
  auto staging = store.CreateStaging();
  EXPECT_TRUE(staging.ok());
  EXPECT_EQ(::pwrite((*staging)->fd(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  auto v = CommitStagedFile(store, fd, &m, **staging, candidates, CommitOptions{}, nullptr);
  ::close(fd);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return {*v, path};
}

bool ObjectExists(Store& store, const ObjectId& id) { return ::access(store.ObjectPath(id).c_str(), F_OK) == 0; }

TEST(GcTest, KeepsDeltaBasesOfLiveFilesAndRemovesGarbage) {
  TempDir dir;
  auto opened = Store::Open(dir.path(), StoreOptions{});
  ASSERT_TRUE(opened.ok());
  Store& store = **opened;
  ASSERT_TRUE(store.ClaimStagingArea().ok());
  auto v1_bytes = RandomBytes(300000, 1);
  auto v2_bytes = v1_bytes;
  v2_bytes[1000] ^= std::byte{1};
  Committed v1 = Commit(store, dir.path() + "/v1", v1_bytes, {});
  ASSERT_TRUE(v1.version.as_base.has_value());
  Committed v2 = Commit(store, dir.path() + "/v2", v2_bytes, {*v1.version.as_base});
  Committed junk = Commit(store, dir.path() + "/junk", RandomBytes(300000, 7), {});
  ASSERT_EQ(::unlink(v1.path.c_str()), 0);  // keep-last-1 rotation
  ASSERT_EQ(::unlink(junk.path.c_str()), 0);
  // One flipped bit: v2 is stored as a delta of v1 (else this test would
  // not test what GC must keep).
  ASSERT_TRUE(v2.version.fields.base.has_value());
  EXPECT_EQ(*v2.version.fields.base, v1.version.fields.object);

  GcOptions options;
  options.grace_seconds = 0;
  auto report = CollectGarbage(store, options, nullptr);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->problems.empty());
  EXPECT_FALSE(ObjectExists(store, junk.version.fields.object));
  EXPECT_TRUE(ObjectExists(store, v2.version.fields.object));
  EXPECT_TRUE(ObjectExists(store, v1.version.fields.object));  // deleted file, kept as v2's base
  EXPECT_EQ(report->removed, 1u);

  // v2 still reads back through its base.
  auto content = FileContent::Open(store, v2.version.fields);
  ASSERT_TRUE(content.ok());
  std::vector<std::byte> out(content->size());
  ASSERT_TRUE(content->ReadAt(0, out).ok());
  EXPECT_EQ(out, v2_bytes);
}

TEST(GcTest, SweepsNothingWhenAMarkedBlobDoesNotOpen) {
  // A live blob that exists but does not open (damaged, or written by a
  // newer build whose links this one cannot read) may need objects that
  // nothing else marks: GC removes nothing until fsck is clean.
  TempDir dir;
  std::string live_object;
  ObjectId junk_id;
  {
    auto opened = Store::Open(dir.path(), StoreOptions{});
    ASSERT_TRUE(opened.ok());
    Store& store = **opened;
    ASSERT_TRUE(store.ClaimStagingArea().ok());
    Committed live = Commit(store, dir.path() + "/live", RandomBytes(300000, 3), {});
    Committed junk = Commit(store, dir.path() + "/junk", RandomBytes(300000, 4), {});
    ASSERT_EQ(::unlink(junk.path.c_str()), 0);
    live_object = store.ObjectPath(live.version.fields.object);
    junk_id = junk.version.fields.object;
  }
  // Damage the live blob's footer.
  int fd = ::open(live_object.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  const char garbage[8] = {'d', 'a', 'm', 'a', 'g', 'e', 'd', '!'};
  ASSERT_EQ(::pwrite(fd, garbage, sizeof garbage, st.st_size - 8), 8);
  ::close(fd);
  auto opened = Store::Open(dir.path(), StoreOptions{});
  ASSERT_TRUE(opened.ok());
  GcOptions options;
  options.grace_seconds = 0;
  auto report = CollectGarbage(**opened, options, nullptr);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->swept);
  EXPECT_EQ(report->removed, 0u);
  EXPECT_TRUE(ObjectExists(**opened, junk_id));
  EXPECT_FALSE(report->problems.empty());
}

TEST(GcTest, GracePeriodProtectsYoungObjects) {
  TempDir dir;
  auto opened = Store::Open(dir.path(), StoreOptions{});
  ASSERT_TRUE(opened.ok());
  Store& store = **opened;
  ASSERT_TRUE(store.ClaimStagingArea().ok());
  Committed junk = Commit(store, dir.path() + "/junk", RandomBytes(300000, 8), {});
  ASSERT_EQ(::unlink(junk.path.c_str()), 0);
  GcOptions options;  // default grace: one hour
  auto report = CollectGarbage(store, options, nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->removed, 0u);
  EXPECT_EQ(report->kept_young, 1u);
  EXPECT_TRUE(ObjectExists(store, junk.version.fields.object));
  // An object named in extra_live (an open, unlinked file) survives too.
  options.grace_seconds = 0;
  options.extra_live = {junk.version.fields.object};
  report = CollectGarbage(store, options, nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(ObjectExists(store, junk.version.fields.object));
}

void Age(Store& store, const ObjectId& id, time_t seconds) {
  struct timespec times[2] = {{::time(nullptr) - seconds, 0}, {::time(nullptr) - seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, store.ObjectPath(id).c_str(), times, 0), 0);
}

// A young unreferenced delta (a commit in flight may be about to name it)
// keeps the old blob below it.
TEST(GcTest, KeepsTheChainBelowAYoungBlob) {
  TempDir dir;
  auto opened = Store::Open(dir.path(), StoreOptions{});
  ASSERT_TRUE(opened.ok());
  Store& store = **opened;
  ASSERT_TRUE(store.ClaimStagingArea().ok());
  auto v1_bytes = testing::Npy(200000, 3, 0.0f);
  auto v2_bytes = testing::Npy(200000, 3, 0.001f);
  Committed v1 = Commit(store, dir.path() + "/v1", v1_bytes, {});
  Committed v2 = Commit(store, dir.path() + "/v2", v2_bytes, {*v1.version.as_base});
  ASSERT_TRUE(v2.version.fields.base.has_value()) << "the codec did not delta v2 against v1";
  ASSERT_EQ(::unlink(v1.path.c_str()), 0);
  ASSERT_EQ(::unlink(v2.path.c_str()), 0);
  Age(store, v1.version.fields.object, 7200);
  auto report = CollectGarbage(store, GcOptions{}, nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(ObjectExists(store, v2.version.fields.object));
  EXPECT_TRUE(ObjectExists(store, v1.version.fields.object));
  EXPECT_EQ(report->removed, 0u);
  Age(store, v2.version.fields.object, 7200);  // once the top is old too, both go
  report = CollectGarbage(store, GcOptions{}, nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->removed, 2u);
}

// A GC that died between renaming an object to <hex>.gc and unlinking it:
// the next run puts it back and decides anew.
TEST(GcTest, RestoresAnObjectLeftRenamedByAnInterruptedSweep) {
  TempDir dir;
  auto opened = Store::Open(dir.path(), StoreOptions{});
  ASSERT_TRUE(opened.ok());
  Store& store = **opened;
  ASSERT_TRUE(store.ClaimStagingArea().ok());
  Committed kept = Commit(store, dir.path() + "/kept", RandomBytes(300000, 4), {});
  std::string path = store.ObjectPath(kept.version.fields.object);
  ASSERT_EQ(::rename(path.c_str(), (path + ".gc").c_str()), 0);
  auto report = CollectGarbage(store, GcOptions{}, nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->problems.empty());
  EXPECT_TRUE(ObjectExists(store, kept.version.fields.object));
  EXPECT_NE(::access((path + ".gc").c_str(), F_OK), 0);
}

// A delta base GC removed while its reader is still cached is not used: the
// new version becomes a key frame instead of naming a missing base.
TEST(GcTest, ABaseRemovedByGcIsNotUsed) {
  TempDir dir;
  auto opened = Store::Open(dir.path(), StoreOptions{});
  ASSERT_TRUE(opened.ok());
  Store& store = **opened;
  ASSERT_TRUE(store.ClaimStagingArea().ok());
  auto v1_bytes = testing::Npy(200000, 5, 0.0f);
  auto v2_bytes = testing::Npy(200000, 5, 0.001f);
  Committed v1 = Commit(store, dir.path() + "/v1", v1_bytes, {});
  // The same pair deltas while the base exists (so the test below can fail).
  Committed probe = Commit(store, dir.path() + "/probe", v2_bytes, {*v1.version.as_base});
  ASSERT_TRUE(probe.version.fields.base.has_value()) << "the codec did not delta v2 against v1";
  ASSERT_EQ(::unlink(probe.path.c_str()), 0);
  Age(store, probe.version.fields.object, 7200);
  ASSERT_TRUE(store.OpenBlob(v1.version.fields.object).ok());  // cached reader, open fd
  ASSERT_EQ(::unlink(v1.path.c_str()), 0);
  Age(store, v1.version.fields.object, 7200);
  auto report = CollectGarbage(store, GcOptions{}, nullptr);
  ASSERT_TRUE(report.ok());
  ASSERT_FALSE(ObjectExists(store, v1.version.fields.object));
  Committed v2 = Commit(store, dir.path() + "/v2", v2_bytes, {*v1.version.as_base});
  EXPECT_FALSE(v2.version.fields.base.has_value());
  auto content = FileContent::Open(store, v2.version.fields);
  ASSERT_TRUE(content.ok());
  std::vector<std::byte> out(content->size());
  ASSERT_TRUE(content->ReadAt(0, out).ok());
  EXPECT_EQ(out, v2_bytes);
}

}  // namespace
}  // namespace ckptfs::fs
