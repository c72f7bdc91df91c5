// Commit and recovery without FUSE: a crash (the fault hook stopping the
// commit) at every step, then recovery by a new "daemon", gives either the
// old or the new file, never anything else, and leaves no staging files.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "fs/commit_pipeline.h"
#include "fs/recovery.h"
#include "fs/store.h"
#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::OpenDaemonStore;
using testing::RandomBytes;
using testing::TempDir;

std::unique_ptr<StagingFile> StageBytes(Store& store, const std::vector<std::byte>& bytes) {
  auto staging = store.CreateStaging();
  EXPECT_TRUE(staging.ok()) << staging.status().ToString();
  EXPECT_EQ(::pwrite((*staging)->fd(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  return std::move(*staging);
}

std::vector<std::byte> ReadFile(Store& store, const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  auto m = ReadManifest(fd);
  ::close(fd);
  EXPECT_TRUE(m.ok() && m->has_value()) << path;
  if (!m.ok() || !m->has_value()) return {};
  EXPECT_NE((*m)->kind, ManifestKind::kStaging) << "recovery left a staging manifest";
  auto content = FileContent::Open(store, **m);
  EXPECT_TRUE(content.ok()) << content.status().ToString();
  if (!content.ok()) return {};
  std::vector<std::byte> out(content->size());
  EXPECT_TRUE(content->ReadAt(0, out).ok());
  return out;
}

size_t CountStagingFiles(const std::string& backing) {
  size_t n = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(backing + "/.ckptfs/staging"))
    if (e.is_regular_file() && e.path().filename() != ".lock") ++n;
  return n;
}

// Commits `bytes` as the content of the manifest file `path` (created empty
// when absent). Returns the status of the commit (an injected crash is an
// error).
Status CommitVersion(Store& store, const std::string& path, const std::vector<std::byte>& bytes,
                     const CommitOptions& options) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd < 0) return Status::Io(errno, "open " + path);
  auto m = ReadManifest(fd);
  Manifest manifest;
  if (m.ok() && m->has_value()) manifest = **m;
  else if (Status init = InitEmptyManifest(fd, false); !init.ok()) return init;
  else manifest.sequence = 2;
  auto staging = StageBytes(store, bytes);
  auto v = CommitStagedFile(store, fd, &manifest, *staging, {}, options, nullptr);
  staging->set_keep(true);  // a crash runs no destructors: leave the file as it is
  ::close(fd);
  return v.status();
}

class CrashAtStepTest : public ::testing::TestWithParam<std::string_view> {};

TEST_P(CrashAtStepTest, RecoveryGivesOldOrNew) {
  TempDir dir;
  std::string file = dir.path() + "/ckpt.bin";
  auto old_bytes = RandomBytes(200000, 1);
  auto new_bytes = RandomBytes(250000, 2);
  {
    auto store = OpenDaemonStore(dir.path());
    ASSERT_TRUE(CommitVersion(*store, file, old_bytes, {}).ok());
  }
  {
    auto store = OpenDaemonStore(dir.path());
    CommitOptions crashing;
    std::string_view step = GetParam();
    crashing.fault = [step](std::string_view at) {
      return at == step ? Status::Internal("injected crash") : Status::Ok();
    };
    Status s = CommitVersion(*store, file, new_bytes, crashing);
    ASSERT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  }  // the "daemon" dies: its staging area's lock is released
  auto store = OpenDaemonStore(dir.path());
  auto report = RecoverStore(*store, CommitOptions{}, nullptr);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->dead_areas, 1u);  // the first daemon exited cleanly and removed its area
  auto got = ReadFile(*store, file);
  if (GetParam() == "after_staging_sync") {
    EXPECT_EQ(got, old_bytes);  // the manifest never named the new version
    EXPECT_EQ(report->orphans_removed, 1u);
  } else {
    EXPECT_EQ(got, new_bytes);
  }
  bool finished_by_recovery = GetParam() == "after_staging_manifest" || GetParam() == "after_objects";
  EXPECT_EQ(report->finished, finished_by_recovery ? 1u : 0u);
  EXPECT_EQ(CountStagingFiles(dir.path()), 0u);
  // Recovering again changes nothing.
  auto again = RecoverStore(*store, CommitOptions{}, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->finished, 0u);
  EXPECT_EQ(ReadFile(*store, file), got);
}

INSTANTIATE_TEST_SUITE_P(AllSteps, CrashAtStepTest, ::testing::ValuesIn(kCommitSteps),
                         [](const auto& param_info) { return std::string(param_info.param); });

TEST(RecoveryTest, LiveDaemonsAreaIsNotTouched) {
  TempDir dir;
  std::string file = dir.path() + "/f";
  auto live = OpenDaemonStore(dir.path());
  CommitOptions stop_after_mark;
  stop_after_mark.fault = [](std::string_view at) {
    return at == "after_staging_manifest" ? Status::Internal("paused") : Status::Ok();
  };
  ASSERT_FALSE(CommitVersion(*live, file, RandomBytes(50000, 3), stop_after_mark).ok());
  auto other = OpenDaemonStore(dir.path());  // a second daemon mounts meanwhile
  auto report = RecoverStore(*other, CommitOptions{}, nullptr);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->dead_areas, 0u);
  EXPECT_EQ(report->finished, 0u);
  EXPECT_EQ(CountStagingFiles(dir.path()), 1u);
}

TEST(CommitTest, InlineBlobAndRawContentRoundTrip) {
  TempDir dir;
  auto store = OpenDaemonStore(dir.path());
  struct Case {
    size_t size;
    bool compress;
    ManifestKind want;
    bool inline_zstd = false;
    bool text = false;  // compressible bytes (a JSON log) instead of random ones
  };
  for (Case c : {Case{0, true, ManifestKind::kInline}, Case{3000, true, ManifestKind::kInline},
                 // Past the plain inline size, a zstd frame that fits a slot stays in the manifest.
                 Case{3073, true, ManifestKind::kInline, true}, Case{40000, true, ManifestKind::kInline, true, true},
                 Case{8000, true, ManifestKind::kBlob}, Case{3 << 20, true, ManifestKind::kBlob},
                 Case{40000, false, ManifestKind::kRaw, false, true}, Case{100000, false, ManifestKind::kRaw}}) {
    std::string path = dir.path() + "/f" + std::to_string(c.size) + (c.compress ? "c" : "r") + (c.text ? "t" : "");
    auto bytes = RandomBytes(c.size, static_cast<uint32_t>(c.size));
    if (c.text) {
      std::string log;
      for (int step = 0; log.size() < c.size; ++step)
        log += "{\"epoch\": " + std::to_string(step / 7) + ", \"loss\": 0." + std::to_string(1000 + step * 37 % 977) +
               ", \"step\": " + std::to_string(step * 10) + "},\n";
      log.resize(c.size);
      bytes.assign(reinterpret_cast<const std::byte*>(log.data()), reinterpret_cast<const std::byte*>(log.data()) + log.size());
    }
    CommitOptions options;
    options.compress = c.compress;
    ASSERT_TRUE(CommitVersion(*store, path, bytes, options).ok());
    int fd = ::open(path.c_str(), O_RDONLY);
    auto m = ReadManifest(fd);
    ::close(fd);
    ASSERT_TRUE(m.ok() && m->has_value());
    EXPECT_EQ((*m)->kind, c.want) << c.size;
    EXPECT_EQ((*m)->inline_zstd, c.inline_zstd) << c.size;
    EXPECT_EQ((*m)->logical_size, c.size);
    EXPECT_EQ(ReadFile(*store, path), bytes) << c.size;
  }
  EXPECT_EQ(CountStagingFiles(dir.path()), 0u);
}

TEST(CommitTest, ObjectsAreContentAddressedAndReadOnly) {
  TempDir dir;
  auto store = OpenDaemonStore(dir.path());
  auto bytes = RandomBytes(100000, 9);
  ASSERT_TRUE(CommitVersion(*store, dir.path() + "/a", bytes, {}).ok());
  ASSERT_TRUE(CommitVersion(*store, dir.path() + "/b", bytes, {}).ok());
  size_t objects = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir.path() + "/.ckptfs/objects")) {
    if (!e.is_regular_file()) continue;
    ++objects;
    auto content = ReadWholeFile(e.path().string());
    ASSERT_TRUE(content.ok());
    EXPECT_EQ(ObjectId::Of(*content).Hex(), e.path().filename().string());
    EXPECT_EQ(static_cast<int>(e.status().permissions() & std::filesystem::perms::all), 0400);  // read-only, private to the daemon (fs/STORE.md)
  }
  EXPECT_EQ(objects, 1u);  // same bytes, same object
}

TEST(StoreTest, UnknownFormatVersionIsUnsupported) {
  TempDir dir;
  { auto store = Store::Open(dir.path(), StoreOptions{}); ASSERT_TRUE(store.ok()); }
  ASSERT_TRUE(WriteWholeFile(dir.path() + "/.ckptfs/format", AsBytes("ckptfs-store 2\n")).ok());
  EXPECT_EQ(Store::Open(dir.path(), StoreOptions{}).status().code(), StatusCode::kUnsupported);
  StoreOptions no_create;
  no_create.create = false;
  TempDir empty;
  EXPECT_EQ(Store::Open(empty.path(), no_create).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckptfs::fs
