// The reconstructions a daemon keeps in its staging area
// (fs/reconstruction_spill.h), and their use by the next version's encode
// and by reads.
#include "fs/reconstruction_spill.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "codec/container/blob.h"
#include "fs/commit_pipeline.h"
#include "fs/store.h"
#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::Commit;
using testing::RandomBytes;
using testing::TempDir;

ObjectId IdOf(uint8_t n) {
  const std::byte b{n};
  return ObjectId::Of(ByteSpan(&b, 1));
}

std::vector<std::byte> Read(ReconstructionSpill& spill, const ObjectId& id, uint64_t offset, size_t n, bool* ok) {
  std::vector<std::byte> out(n);
  *ok = spill.Read(id, offset, out);
  return out;
}

TEST(ReconstructionSpill, KeepsReadsAndBoundsWhatItHolds) {
  TempDir dir;
  ReconstructionSpill spill(dir.path(), 250000);
  const auto a = RandomBytes(100000, 1), b = RandomBytes(100000, 2), c = RandomBytes(100000, 3);
  for (const auto& [id, bytes] : {std::pair{IdOf(1), &a}, std::pair{IdOf(2), &b}}) {
    auto pending = spill.Write(*bytes);
    ASSERT_TRUE(pending.ok()) << pending.status().ToString();
    spill.Keep(id, std::move(*pending));
  }
  EXPECT_EQ(spill.count(), 2u);
  EXPECT_EQ(spill.bytes(), 200000u);
  // Unnamed files: nothing appears in the directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  bool ok = false;
  auto got = Read(spill, IdOf(1), 1000, 5000, &ok);
  ASSERT_TRUE(ok);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), a.begin() + 1000));
  Read(spill, IdOf(1), 99000, 2000, &ok);
  EXPECT_FALSE(ok) << "past its end";
  Read(spill, IdOf(9), 0, 10, &ok);
  EXPECT_FALSE(ok) << "never kept";
  // A third does not fit: the least recently used (2: 1 was just read) leaves.
  auto third = spill.Write(c);
  ASSERT_TRUE(third.ok());
  spill.Keep(IdOf(3), std::move(*third));
  EXPECT_EQ(spill.count(), 2u);
  Read(spill, IdOf(2), 0, 10, &ok);
  EXPECT_FALSE(ok);
  got = Read(spill, IdOf(3), 0, 100000, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(got, c);
  // A successor replaces its base.
  auto next = spill.Write(b);
  ASSERT_TRUE(next.ok());
  const ObjectId replaced = IdOf(3);
  spill.Keep(IdOf(4), std::move(*next), &replaced);
  Read(spill, IdOf(3), 0, 10, &ok);
  EXPECT_FALSE(ok);
  Read(spill, IdOf(1), 0, 10, &ok);
  EXPECT_TRUE(ok);
  EXPECT_EQ(spill.bytes(), 200000u);
  // Larger than the whole spill: not written.
  auto huge = spill.Write(RandomBytes(300000, 4));
  ASSERT_TRUE(huge.ok());
  EXPECT_TRUE(huge->empty());
  spill.Keep(IdOf(5), std::move(*huge));
  EXPECT_EQ(spill.count(), 2u);
  EXPECT_EQ(spill.Blobs(), (std::vector<ObjectId>{IdOf(1), IdOf(4)}));
  spill.Drop(IdOf(1));
  EXPECT_EQ(spill.count(), 1u);
  EXPECT_EQ(spill.bytes(), 100000u);
  // A reader whose chunk's checksum did not match forgets the blob.
  static_cast<ChunkSpill&>(spill).Forget(IdOf(4));
  EXPECT_EQ(spill.count(), 0u);
  EXPECT_EQ(spill.bytes(), 0u);
}

// A write leaves a tenth of the filesystem (at least 1 GiB) free: the
// least recently used leave for it, and when none is left to leave, the
// write is skipped. (A filesystem whose free space shrinks with what the
// spill holds: `base` bytes above the share when it holds nothing.)
TEST(ReconstructionSpill, LeavesItsShareOfTheFilesystemFree) {
  TempDir dir;
  constexpr uint64_t kTotal = uint64_t{20} << 30;  // the share is 2 GiB
  constexpr uint64_t kShare = kTotal / 10;
  uint64_t base = 250000;
  ReconstructionSpill* self = nullptr;
  ReconstructionSpill spill(dir.path(), 1 << 30, [&]() -> std::optional<ReconstructionSpill::Space> {
    return ReconstructionSpill::Space{kTotal, kShare + base - self->bytes()};
  });
  self = &spill;
  const auto a = RandomBytes(100000, 1), b = RandomBytes(100000, 2), c = RandomBytes(100000, 3);
  for (const auto& [id, bytes] : {std::pair{IdOf(1), &a}, std::pair{IdOf(2), &b}}) {
    auto pending = spill.Write(*bytes);
    ASSERT_TRUE(pending.ok());
    ASSERT_FALSE(pending->empty());
    spill.Keep(id, std::move(*pending));
  }
  EXPECT_EQ(spill.count(), 2u);
  // 50000 bytes above the share: the third needs the oldest's room.
  auto third = spill.Write(c);
  ASSERT_TRUE(third.ok());
  ASSERT_FALSE(third->empty());
  spill.Keep(IdOf(3), std::move(*third));
  EXPECT_EQ(spill.Blobs(), (std::vector<ObjectId>{IdOf(3), IdOf(2)}));
  bool ok = false;
  Read(spill, IdOf(1), 0, 10, &ok);
  EXPECT_FALSE(ok) << "left for the share";
  // The filesystem filled up by others: everything leaves, and a write that
  // still does not fit is skipped.
  base = 50000;
  auto fourth = spill.Write(a);
  ASSERT_TRUE(fourth.ok());
  EXPECT_TRUE(fourth->empty());
  EXPECT_EQ(spill.count(), 0u);
  EXPECT_EQ(spill.bytes(), 0u);
  // Free space unknown: nothing is written.
  ReconstructionSpill blind(dir.path(), 1 << 30, [] { return std::optional<ReconstructionSpill::Space>(); });
  auto none = blind.Write(a);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// A reconstruction held in memory is served until its holder goes; one
// that is also kept is then read from its file.
TEST(ReconstructionSpill, ServesAHeldReconstructionFromMemory) {
  TempDir dir;
  ReconstructionSpill spill(dir.path(), 1 << 20);
  auto bytes = std::make_shared<std::vector<std::byte>>(RandomBytes(100000, 7));
  auto held = spill.Hold(IdOf(1), *bytes, bytes);
  bool ok = false;
  auto got = Read(spill, IdOf(1), 500, 1000, &ok);
  ASSERT_TRUE(ok);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes->begin() + 500));
  Read(spill, IdOf(1), 99500, 1000, &ok);
  EXPECT_FALSE(ok) << "past its end";
  EXPECT_EQ(spill.count(), 0u) << "memory, not a kept file";
  EXPECT_TRUE(spill.Blobs().empty());
  // Kept while held: the file serves it after the holder goes.
  auto pending = spill.Write(*bytes);
  ASSERT_TRUE(pending.ok());
  spill.Keep(IdOf(1), std::move(*pending));
  held.reset();
  std::weak_ptr<std::vector<std::byte>> memory = bytes;
  bytes.reset();
  EXPECT_TRUE(memory.expired()) << "the spill let go of the memory";
  got = Read(spill, IdOf(1), 500, 1000, &ok);
  ASSERT_TRUE(ok);
  // Held and never kept: gone with its holder; a Drop lets go of it too.
  auto other = std::make_shared<std::vector<std::byte>>(RandomBytes(1000, 8));
  auto second = spill.Hold(IdOf(2), *other, other);
  Read(spill, IdOf(2), 0, 10, &ok);
  EXPECT_TRUE(ok);
  second.reset();
  Read(spill, IdOf(2), 0, 10, &ok);
  EXPECT_FALSE(ok);
  auto third = spill.Hold(IdOf(3), *other, other);
  spill.Drop(IdOf(3));
  Read(spill, IdOf(3), 0, 10, &ok);
  EXPECT_FALSE(ok);
  third.reset();  // after a Drop: nothing left to remove
  // A later holder of the same blob is not removed by an earlier one's end.
  auto first_holder = spill.Hold(IdOf(4), *other, other);
  auto later_holder = spill.Hold(IdOf(4), *other, other);
  first_holder.reset();
  Read(spill, IdOf(4), 0, 10, &ok);
  EXPECT_TRUE(ok);
}

// Reconstructions stay in memory up to the memory bound; the least
// recently used there go to their files, one too large for memory goes
// to a file at once, and every byte reads back wherever it is.
TEST(ReconstructionSpill, KeepsTheNewestInMemoryAndWritesTheRest) {
  TempDir dir;
  ReconstructionSpill spill(dir.path(), 1000000, ReconstructionSpill::SpaceProbe{}, /*memory_bytes=*/250000);
  const auto a = RandomBytes(100000, 1), b = RandomBytes(100000, 2), c = RandomBytes(100001, 3);
  const auto big = RandomBytes(300000, 4);
  std::vector<std::string> errors;
  auto on_error = [&](const Status& s) { errors.push_back(s.ToString()); };
  auto keep = [&](uint8_t id, const std::vector<std::byte>& bytes, const ObjectId* replaces = nullptr,
                  const ObjectId* demotes = nullptr) {
    auto owner = std::make_shared<std::vector<std::byte>>(bytes);
    spill.KeepReconstruction(IdOf(id), *owner, owner, replaces, demotes, on_error);
  };
  auto reads_back = [&](uint8_t id, const std::vector<std::byte>& bytes) {
    bool ok = false;
    auto got = Read(spill, IdOf(id), 0, bytes.size(), &ok);
    return ok && got == bytes;
  };
  keep(1, a);
  keep(2, b);
  EXPECT_EQ(spill.count(), 2u);
  EXPECT_EQ(spill.memory_bytes(), 200000u);
  EXPECT_EQ(spill.bytes(), 0u) << "nothing written while both fit in memory";
  EXPECT_TRUE(reads_back(1, a));  // 1 is now the most recently used
  keep(3, c);
  EXPECT_EQ(spill.count(), 3u);
  EXPECT_EQ(spill.memory_bytes(), 200001u) << "2, the least recently used, left memory";
  EXPECT_EQ(spill.bytes(), 100000u) << "for its file";
  for (auto [id, bytes] : {std::pair{1, &a}, std::pair{2, &b}, std::pair{3, &c}})
    EXPECT_TRUE(reads_back(static_cast<uint8_t>(id), *bytes)) << id;
  // Too large for memory: a file at once; replacing 3 drops it.
  const ObjectId three = IdOf(3);
  keep(4, big, &three);
  EXPECT_EQ(spill.count(), 3u);
  EXPECT_EQ(spill.memory_bytes(), 100000u);
  EXPECT_EQ(spill.bytes(), 400000u);
  EXPECT_TRUE(reads_back(4, big));
  bool ok = true;
  Read(spill, IdOf(3), 0, 1, &ok);
  EXPECT_FALSE(ok) << "replaced";
  spill.Drop(IdOf(1));
  EXPECT_EQ(spill.memory_bytes(), 0u);
  // A version whose base is an anchor: the base goes to its file at once.
  const auto d = RandomBytes(50000, 5), e = RandomBytes(50000, 6);
  keep(6, d);
  const ObjectId six = IdOf(6);
  keep(7, e, nullptr, &six);
  EXPECT_EQ(spill.memory_bytes(), 50000u) << "only the newest in memory";
  EXPECT_EQ(spill.bytes(), 450000u);
  EXPECT_TRUE(reads_back(6, d));
  EXPECT_TRUE(reads_back(7, e));
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "unnamed files";
}

// What the spill keeps in memory is viewed in place (a base read of the
// next encode), alive while the view's owner is held; what it keeps in a
// file is not in memory, and Read copies it.
TEST(ReconstructionSpill, ViewsWhatItKeepsInMemory) {
  TempDir dir;
  ReconstructionSpill spill(dir.path(), 1000000, ReconstructionSpill::SpaceProbe{}, /*memory_bytes=*/150000);
  const auto a = RandomBytes(100000, 1), b = RandomBytes(100000, 2);
  std::vector<std::string> errors;
  auto on_error = [&](const Status& s) { errors.push_back(s.ToString()); };
  auto owner_a = std::make_shared<std::vector<std::byte>>(a);
  spill.KeepReconstruction(IdOf(1), *owner_a, owner_a, nullptr, nullptr, on_error);
  std::optional<ChunkSpill::View> view = spill.ViewInMemory(IdOf(1), 1000, 5000);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->bytes.data(), owner_a->data() + 1000) << "in place";
  EXPECT_EQ(view->bytes.size(), 5000u);
  EXPECT_FALSE(spill.ViewInMemory(IdOf(1), 99000, 2000)) << "past its end";
  EXPECT_FALSE(spill.ViewInMemory(IdOf(9), 0, 10)) << "not kept";
  // 2 pushes 1 out of memory, to its file: no view, but Read has it.
  auto owner_b = std::make_shared<std::vector<std::byte>>(b);
  spill.KeepReconstruction(IdOf(2), *owner_b, owner_b, nullptr, nullptr, on_error);
  EXPECT_FALSE(spill.ViewInMemory(IdOf(1), 0, 10));
  bool ok = false;
  EXPECT_EQ(Read(spill, IdOf(1), 1000, 5000, &ok), std::vector<std::byte>(a.begin() + 1000, a.begin() + 6000));
  EXPECT_TRUE(ok);
  // The earlier view still holds its memory, whatever the spill let go of.
  owner_a.reset();
  EXPECT_TRUE(std::equal(view->bytes.begin(), view->bytes.end(), a.begin() + 1000));
  std::optional<ChunkSpill::View> view_b = spill.ViewInMemory(IdOf(2), 0, b.size());
  ASSERT_TRUE(view_b.has_value());
  owner_b.reset();
  spill.Drop(IdOf(2));
  EXPECT_FALSE(spill.ViewInMemory(IdOf(2), 0, 10));
  EXPECT_TRUE(std::equal(view_b->bytes.begin(), view_b->bytes.end(), b.begin()));
  // A reconstruction held from commit to background job is in memory too.
  const auto c = RandomBytes(3000, 3);
  auto owner_c = std::make_shared<std::vector<std::byte>>(c);
  auto held = spill.Hold(IdOf(3), *owner_c, owner_c);
  std::optional<ChunkSpill::View> view_c = spill.ViewInMemory(IdOf(3), 10, 20);
  ASSERT_TRUE(view_c.has_value());
  EXPECT_EQ(view_c->bytes.data(), owner_c->data() + 10);
  EXPECT_TRUE(errors.empty()) << errors.front();
}

TEST(ReconstructionSpill, KeepsAtMostItsEntryCount) {
  TempDir dir;
  ReconstructionSpill spill(dir.path(), uint64_t{1} << 30);
  const auto bytes = RandomBytes(1000, 5);
  for (int i = 0; i < static_cast<int>(ReconstructionSpill::kMaxEntries) + 6; ++i) {
    auto pending = spill.Write(bytes);
    ASSERT_TRUE(pending.ok());
    spill.Keep(IdOf(static_cast<uint8_t>(i)), std::move(*pending));
  }
  EXPECT_EQ(spill.count(), ReconstructionSpill::kMaxEntries) << "each holds a descriptor";
  std::byte one[1];
  EXPECT_FALSE(spill.Read(IdOf(0), 0, one)) << "the oldest left";
  EXPECT_TRUE(spill.Read(IdOf(static_cast<uint8_t>(ReconstructionSpill::kMaxEntries + 5)), 0, one));
}

// A lossy commit keeps its reconstruction (after its manifest is written);
// the next version's encode reads its base from there, and reads are
// served from there.
TEST(ReconstructionSpill, ALossyCommitKeepsItsReconstructionForTheNextVersion) {
  TempDir dir;
  StoreOptions options;
  options.chunk_cache_bytes = 1 << 20;  // the file is over half of it: not cached
  options.reconstruction_spill = true;
  auto opened = Store::Open(dir.path(), options);
  ASSERT_TRUE(opened.ok());
  Store& store = **opened;
  ASSERT_TRUE(store.ClaimStagingArea().ok());
  ReconstructionSpill* spill = store.reconstruction_spill();
  ASSERT_NE(spill, nullptr);
  EXPECT_GT(spill->capacity_bytes(), 0u);
  CommitOptions commit;
  commit.encode.lossy_budget = [](FileFormat, const TensorInfo&) {
    lossy::Budget b;
    b.rel_l2 = 0.01;
    return b;
  };
  const auto v1 = testing::Npy(300000, 3, 0.0f);
  auto first = Commit(store, "run/step-1/ckpt.npy", v1, commit);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_GT(first->stats.lossy_chunks, 0u);
  EXPECT_EQ(spill->count(), 1u);
  EXPECT_EQ(spill->bytes(), v1.size());
  auto reader = store.OpenBlob(first->fields.object);
  ASSERT_TRUE(reader.ok());
  auto expected = DecodeAll(**reader);  // from the spill, checked against the blob's checksums
  ASSERT_TRUE(expected.ok()) << expected.status().ToString();
  EXPECT_NE(*expected, v1) << "lossy";

  // Its stored chunks destroyed: the next version still deltas against it
  // (its base comes from the spill), and reads of it still work.
  const std::string object = store.ObjectPath(first->fields.object);
  ASSERT_EQ(::chmod(object.c_str(), 0600), 0);
  {
    int fd = ::open(object.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const std::vector<std::byte> junk(4096, std::byte{0x5a});
    for (const ChunkInfo& c : (*reader)->chunks()) {
      if (c.stored_length >= 64) {
        ASSERT_EQ(::pwrite(fd, junk.data(), 64, static_cast<off_t>(c.stored_offset)), 64);
      }
    }
    ::close(fd);
  }
  auto again = DecodeAll(**reader);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *expected);
  const auto v2 = testing::Npy(300000, 3, 0.01f);
  auto second = Commit(store, "run/step-2/ckpt.npy", v2, commit, {*first->as_base});
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->fields.base, first->fields.object) << "a delta against the spilled base";
  EXPECT_EQ(spill->count(), 2u) << "a key frame stays: it is an anchor, later anchor frames read it";
  // A delta's successor replaces it.
  auto third = Commit(store, "run/step-3/ckpt.npy", testing::Npy(300000, 3, 0.02f), commit, {*second->as_base});
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(third->fields.base, second->fields.object);
  EXPECT_EQ(spill->count(), 2u);
  std::byte one[1];
  EXPECT_FALSE(spill->Read(second->fields.object, 0, one));
  EXPECT_TRUE(spill->Read(third->fields.object, 0, one));
  EXPECT_TRUE(spill->Read(first->fields.object, 0, one));

  // A kept reconstruction whose object a GC removed goes with it.
  const std::string third_object = store.ObjectPath(third->fields.object);
  ASSERT_EQ(::unlink(third_object.c_str()), 0);
  EXPECT_GE(store.DropRemovedObjects(), 1u);
  EXPECT_EQ(spill->count(), 1u);
  EXPECT_FALSE(spill->Read(third->fields.object, 0, one));
  EXPECT_TRUE(spill->Read(first->fields.object, 0, one));

  // Without the spill, the destroyed chunks are found out.
  store.chunk_cache()->SetSpill(nullptr);
  auto fresh = store.OpenBlob(second->fields.object);
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(DecodeAll(**fresh).ok());
}

}  // namespace
}  // namespace ckptfs::fs
