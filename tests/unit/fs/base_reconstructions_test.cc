// Reconstructions kept on the node's disk as the next version's base
// (fs/base_reconstructions.h): used only when they match the blob's size
// and checksum, replaced by the version encoded against them, bounded, and
// never visible in the directory; a commit of a file larger than the chunk
// cache keeps one and the next version's delta frame reads it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "codec/container/blob.h"
#include "codec/format/layout.h"
#include "fs/base_reconstructions.h"
#include "fs/commit_pipeline.h"
#include "fs/store.h"
#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::Npy;
using testing::TempDir;

struct Blob {
  ObjectId id;
  std::shared_ptr<const BlobReader> reader;
};

Blob EncodeInMemory(const std::vector<std::byte>& bytes) {
  VectorSink sink;
  EXPECT_TRUE(EncodeBlob(bytes, DetectLayout(bytes), nullptr, EncodeOptions{}, &sink).ok());
  Blob b;
  b.id = ObjectId::Of(sink.bytes);
  auto reader = BlobReader::Open(std::make_shared<MemoryFile>(std::move(sink.bytes)), b.id, nullptr);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  b.reader = *reader;
  return b;
}

// Whether `dir`'s filesystem makes unnamed files (some overlay
// filesystems do not: the daemon then keeps nothing, as tested last).
bool UnnamedFilesWork(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}
#define SKIP_WITHOUT_UNNAMED_FILES(dir) \
  if (!UnnamedFilesWork(dir)) GTEST_SKIP() << "O_TMPFILE is not supported in " << (dir)

size_t DirEntries(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(BaseReconstructions, AMatchingReconstructionServesReadsAndLeavesNoName) {
  TempDir dir;
  SKIP_WITHOUT_UNNAMED_FILES(dir.path());
  BaseReconstructions kept(dir.path(), 1ull << 30);
  const std::vector<std::byte> bytes = Npy(50000, 1, 0.0f);
  const Blob blob = EncodeInMemory(bytes);
  auto pending = kept.Write(bytes);
  ASSERT_TRUE(pending.has_value());
  kept.Keep(blob.id, std::move(*pending), std::nullopt);
  EXPECT_EQ(kept.kept_count(), 1u);
  EXPECT_EQ(kept.kept_bytes(), bytes.size());
  EXPECT_EQ(DirEntries(dir.path()), 0u);  // unnamed: gone with the daemon

  std::shared_ptr<const BlobReader> wrapped = kept.Wrap(blob.id, blob.reader);
  EXPECT_NE(wrapped, blob.reader);
  EXPECT_EQ(wrapped->file_checksum(), blob.reader->file_checksum());
  EXPECT_EQ(wrapped->chunks().size(), blob.reader->chunks().size());
  std::vector<std::byte> got(1000);
  ASSERT_TRUE(wrapped->ReadAt(12345, got).ok());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin() + 12345));
  EXPECT_FALSE(wrapped->ReadAt(bytes.size() - 10, got).ok());  // past the end
  // Another blob's id finds nothing.
  const Blob other = EncodeInMemory(Npy(50000, 2, 0.0f));
  EXPECT_EQ(kept.Wrap(other.id, other.reader), other.reader);
}

TEST(BaseReconstructions, AMismatchIsNeverUsedAndIsDropped) {
  TempDir dir;
  SKIP_WITHOUT_UNNAMED_FILES(dir.path());
  BaseReconstructions kept(dir.path(), 1ull << 30);
  const std::vector<std::byte> bytes = Npy(50000, 1, 0.0f);
  const Blob blob = EncodeInMemory(bytes);
  std::vector<std::byte> wrong = bytes;
  wrong[wrong.size() / 2] ^= std::byte{1};  // same size, one bit off
  auto pending = kept.Write(wrong);
  ASSERT_TRUE(pending.has_value());
  kept.Keep(blob.id, std::move(*pending), std::nullopt);
  EXPECT_EQ(kept.Wrap(blob.id, blob.reader), blob.reader);
  EXPECT_EQ(kept.kept_count(), 0u);
  // A shorter file too.
  pending = kept.Write(ByteSpan(bytes).first(bytes.size() - 4));
  ASSERT_TRUE(pending.has_value());
  kept.Keep(blob.id, std::move(*pending), std::nullopt);
  EXPECT_EQ(kept.Wrap(blob.id, blob.reader), blob.reader);
  EXPECT_EQ(kept.kept_count(), 0u);
}

TEST(BaseReconstructions, TheNextVersionReplacesItsBaseAndTheCapacityHolds) {
  TempDir dir;
  SKIP_WITHOUT_UNNAMED_FILES(dir.path());
  const std::vector<std::byte> a = Npy(20000, 1, 0.0f), b = Npy(20000, 2, 0.0f), c = Npy(20000, 3, 0.0f);
  BaseReconstructions kept(dir.path(), 2 * a.size());
  const Blob ba = EncodeInMemory(a), bb = EncodeInMemory(b), bc = EncodeInMemory(c);
  kept.Keep(ba.id, *kept.Write(a), std::nullopt);
  kept.Keep(bb.id, *kept.Write(b), ba.id);  // b was encoded against a
  EXPECT_EQ(kept.kept_count(), 1u);
  EXPECT_EQ(kept.Wrap(ba.id, ba.reader), ba.reader);
  EXPECT_NE(kept.Wrap(bb.id, bb.reader), bb.reader);
  kept.Keep(ba.id, *kept.Write(a), std::nullopt);
  kept.Keep(bc.id, *kept.Write(c), std::nullopt);  // over the capacity: the oldest (b) goes
  EXPECT_EQ(kept.kept_count(), 2u);
  EXPECT_EQ(kept.Wrap(bb.id, bb.reader), bb.reader);
  EXPECT_NE(kept.Wrap(bc.id, bc.reader), bc.reader);
  // Larger than the capacity, or nowhere to write: nothing.
  EXPECT_FALSE(kept.Write(Npy(60000, 4, 0.0f)).has_value());
  BaseReconstructions nowhere(dir.path() + "/missing", 1ull << 30);
  EXPECT_FALSE(nowhere.Write(a).has_value());
}

// Through the commit pipeline: a file larger than half the chunk cache
// keeps its reconstruction; the next version is a delta frame against it,
// reads back exactly, and takes its base's place.
TEST(BaseReconstructions, ACommitKeepsItAndTheNextDeltaFrameUsesIt) {
  TempDir dir;
  StoreOptions store_options;
  store_options.chunk_cache_bytes = 64 << 10;
  auto opened = Store::Open(dir.path(), store_options);
  ASSERT_TRUE(opened.ok());
  Store& store = **opened;
  ASSERT_TRUE(store.ClaimStagingArea().ok());
  SKIP_WITHOUT_UNNAMED_FILES(store.StagingRoot());
  CommitOptions options;
  options.reconstructions = std::make_shared<BaseReconstructions>(store.StagingRoot(), 1ull << 30);
  auto encode = [&](const std::vector<std::byte>& bytes, std::vector<BaseCandidate> candidates) {
    auto staging = store.CreateStaging();
    EXPECT_TRUE(staging.ok());
    EXPECT_EQ(::pwrite((*staging)->fd(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    auto v = EncodeStaged(store, (*staging)->fd(), (*staging)->path(), candidates, options, nullptr, "ckpt.npy");
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return *v;
  };
  const std::vector<std::byte> v1 = Npy(200000, 1, 0.0f), v2 = Npy(200000, 1, 0.25f);
  const EncodedVersion e1 = encode(v1, {});
  EXPECT_EQ(options.reconstructions->kept_count(), 1u);
  EXPECT_EQ(options.reconstructions->kept_bytes(), v1.size());
  const EncodedVersion e2 = encode(v2, {*e1.as_base});
  ASSERT_TRUE(e2.fields.base.has_value());
  EXPECT_EQ(*e2.fields.base, e1.fields.object);
  EXPECT_EQ(options.reconstructions->kept_count(), 1u);  // v2's replaced v1's
  auto reader = store.OpenBlob(e2.fields.object);
  ASSERT_TRUE(reader.ok());
  auto back = DecodeAll(**reader);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, v2);

  // The next version reads its base from the kept file, not the store: with
  // v2's stored chunks damaged it is still a delta frame against v2 (from
  // the store alone each chunk would fail its checksum and be a key frame).
  {
    const int fd = ::open(store.ObjectPath(e2.fields.object).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (const ChunkInfo& c : (*reader)->chunks()) {
      std::byte b;
      const off_t at = static_cast<off_t>(c.stored_offset + c.stored_length / 2);
      ASSERT_EQ(::pread(fd, &b, 1, at), 1);
      b ^= std::byte{0x40};
      ASSERT_EQ(::pwrite(fd, &b, 1, at), 1);
    }
    ::close(fd);
  }
  store.chunk_cache()->Drop(e2.fields.object, 0);
  const EncodedVersion e3 = encode(Npy(200000, 1, 0.5f), {*e2.as_base});
  ASSERT_TRUE(e3.fields.base.has_value());
  EXPECT_EQ(*e3.fields.base, e2.fields.object);
  EXPECT_GT(e3.stats.delta_chunks, 0u);
}

}  // namespace
}  // namespace ckptfs::fs
