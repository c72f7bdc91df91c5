#include "fs/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zstd.h>

#include "tests/unit/fs/test_util.h"

namespace ckptfs::fs {
namespace {
using testing::RandomBytes;
using testing::TempDir;

Manifest SampleBlobManifest() {
  Manifest m;
  m.kind = ManifestKind::kBlob;
  m.format = FileFormat::kTorchZip;
  m.sequence = 7;
  m.logical_size = 123456789;
  m.stored_bytes = 4567;
  m.object = ObjectId::Of(AsBytes("object"));
  m.base = ObjectId::Of(AsBytes("base"));
  m.chain_depth = 3;
  return m;
}

TEST(ManifestTest, EncodeDecodeRoundTrip) {
  Manifest m = SampleBlobManifest();
  std::vector<std::byte> slot;
  m.EncodeTo(&slot);
  EXPECT_EQ(slot.size(), Manifest::kHeaderSize + Manifest::kTrailerSize);
  auto back = Manifest::DecodeFrom(slot);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, m.kind);
  EXPECT_EQ(back->format, m.format);
  EXPECT_EQ(back->sequence, 7u);
  EXPECT_EQ(back->logical_size, m.logical_size);
  EXPECT_EQ(back->stored_bytes, m.stored_bytes);
  EXPECT_EQ(back->object, m.object);
  ASSERT_TRUE(back->base.has_value());
  EXPECT_EQ(*back->base, *m.base);
  EXPECT_EQ(back->chain_depth, 3u);
}

TEST(ManifestTest, InlineDataRoundTrip) {
  Manifest m;
  m.kind = ManifestKind::kInline;
  m.inline_data = RandomBytes(Manifest::kMaxInline, 1);
  m.logical_size = m.inline_data.size();
  std::vector<std::byte> slot;
  m.EncodeTo(&slot);
  EXPECT_EQ(slot.size(), Manifest::kSlotSize);
  auto back = Manifest::DecodeFrom(slot);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->inline_data, m.inline_data);
  EXPECT_FALSE(back->base.has_value());
}

TEST(ManifestTest, EveryFlippedByteIsRejected) {
  Manifest m = SampleBlobManifest();
  std::vector<std::byte> slot;
  m.EncodeTo(&slot);
  for (size_t i = 0; i < slot.size(); ++i) {
    for (uint8_t bit : {uint8_t{1}, uint8_t{0x80}}) {
      std::vector<std::byte> bad = slot;
      bad[i] ^= std::byte(bit);
      EXPECT_FALSE(Manifest::DecodeFrom(bad).ok()) << "byte " << i;
    }
  }
  for (size_t n = 0; n < slot.size(); ++n) EXPECT_FALSE(Manifest::DecodeFrom(ByteSpan(slot).first(n)).ok());
}

TEST(ManifestTest, InlineSizeMustMatchLogicalSize) {
  Manifest m;
  m.kind = ManifestKind::kInline;
  m.inline_data = RandomBytes(10, 2);
  m.logical_size = 11;
  std::vector<std::byte> slot;
  m.EncodeTo(&slot);
  EXPECT_EQ(Manifest::DecodeFrom(slot).status().code(), StatusCode::kCorruption);
}

// A record re-checksummed after an edit of its bytes (so that the field
// rules, not the checksum, decide).
std::vector<std::byte> Resealed(std::vector<std::byte> slot, size_t at, std::byte value) {
  slot[at] = value;
  StoreLE64(slot.data() + slot.size() - 8, Checksum64(ByteSpan(slot).first(slot.size() - 8)));
  return slot;
}

Manifest CompressedInline(size_t size) {
  std::string text;
  while (text.size() < size) text += "{\"loss\": 0.25, \"step\": " + std::to_string(text.size()) + "}\n";
  text.resize(size);
  Manifest m;
  m.kind = ManifestKind::kInline;
  m.logical_size = size;
  m.inline_zstd = true;
  m.inline_data.resize(ZSTD_compressBound(size));
  m.inline_data.resize(ZSTD_compress(m.inline_data.data(), m.inline_data.size(), text.data(), size, 3));
  return m;
}

TEST(ManifestTest, CompressedInlineRecordsAreVersionTwoAndChecked) {
  Manifest m = CompressedInline(20000);
  ASSERT_LE(m.inline_data.size(), Manifest::kMaxInline);
  std::vector<std::byte> slot;
  m.EncodeTo(&slot);
  EXPECT_EQ(LoadLE16(slot.data() + 8), Manifest::kVersionInlineZstd);
  auto back = Manifest::DecodeFrom(slot);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->inline_zstd);
  EXPECT_EQ(back->inline_data, m.inline_data);
  EXPECT_EQ(std::string(StorageName(*back)), "inline+zstd");
  // Plain records stay version 1 (readable by older builds).
  Manifest plain = SampleBlobManifest();
  plain.EncodeTo(&slot);
  EXPECT_EQ(LoadLE16(slot.data() + 8), Manifest::kVersion);

  m.EncodeTo(&slot);
  // The flag needs version 2; version 2 needs the flag.
  EXPECT_EQ(Manifest::DecodeFrom(Resealed(slot, 8, std::byte{1})).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(Manifest::DecodeFrom(Resealed(slot, 12, std::byte{0})).status().code(), StatusCode::kCorruption);
  // Only on inline records.
  EXPECT_EQ(Manifest::DecodeFrom(Resealed(slot, 10, std::byte{2})).status().code(), StatusCode::kCorruption);
  // The frame must declare exactly the file's size, and the size is bounded.
  for (uint64_t size : {uint64_t{19999}, uint64_t{20001}, uint64_t{Manifest::kMaxInlineZstdSize + 1}}) {
    Manifest wrong = m;
    wrong.logical_size = size;
    wrong.EncodeTo(&slot);
    EXPECT_EQ(Manifest::DecodeFrom(slot).status().code(), StatusCode::kCorruption) << size;
  }
  // Bytes that are no frame.
  Manifest garbage = m;
  garbage.inline_data = RandomBytes(100, 3);
  garbage.EncodeTo(&slot);
  EXPECT_EQ(Manifest::DecodeFrom(slot).status().code(), StatusCode::kCorruption);
}

class ManifestFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/m";
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override { ::close(fd_); }
  TempDir dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_F(ManifestFileTest, PlainFileIsNotAManifest) {
  auto data = RandomBytes(10000, 3);
  ASSERT_EQ(::pwrite(fd_, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  auto m = ReadManifest(fd_);
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(m->has_value());
}

TEST_F(ManifestFileTest, UpdatesAlternateSlotsAndNewestWins) {
  ASSERT_TRUE(InitEmptyManifest(fd_, false).ok());
  auto m = ReadManifest(fd_);
  ASSERT_TRUE(m.ok() && m->has_value());
  Manifest cur = **m;
  EXPECT_EQ(cur.logical_size, 0u);
  for (int i = 1; i <= 5; ++i) {
    Manifest next = SampleBlobManifest();
    next.sequence = cur.sequence;
    next.logical_size = static_cast<uint64_t>(i);
    ASSERT_TRUE(WriteManifest(fd_, &next, false).ok());
    auto read = ReadManifest(fd_);
    ASSERT_TRUE(read.ok() && read->has_value());
    EXPECT_EQ((*read)->logical_size, static_cast<uint64_t>(i));
    EXPECT_EQ((*read)->sequence, next.sequence);
    cur = next;
  }
}

TEST_F(ManifestFileTest, TornWriteOfNewestSlotFallsBackToTheOther) {
  ASSERT_TRUE(InitEmptyManifest(fd_, false).ok());
  Manifest a = SampleBlobManifest();
  a.sequence = 2;
  a.logical_size = 111;
  ASSERT_TRUE(WriteManifest(fd_, &a, false).ok());  // sequence 3, slot 1
  Manifest b = a;
  b.logical_size = 222;
  ASSERT_TRUE(WriteManifest(fd_, &b, false).ok());  // sequence 4, slot 0
  // Tear slot 0 (the newest): the reader must return slot 1's record.
  std::byte garbage[40] = {};
  ASSERT_EQ(::pwrite(fd_, garbage, sizeof garbage, 30), 40);
  auto m = ReadManifest(fd_);
  ASSERT_TRUE(m.ok() && m->has_value());
  EXPECT_EQ((*m)->logical_size, 111u);
}

// Recovery takes the committed record a staging record replaced from the
// other slot (fs/recovery.cc): present after one update, gone after the
// next, none beside a torn newest slot or a fresh manifest.
TEST_F(ManifestFileTest, TheReplacedRecordIsTheOlderSlot) {
  ASSERT_TRUE(InitEmptyManifest(fd_, false).ok());
  auto none = ReadReplacedManifest(fd_);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());  // slot 1 never written
  Manifest committed = SampleBlobManifest();
  committed.sequence = 1;
  committed.logical_size = 111;
  ASSERT_TRUE(WriteManifest(fd_, &committed, false).ok());  // sequence 2, slot 0 (over the empty record)
  Manifest staging;
  staging.kind = ManifestKind::kStaging;
  staging.sequence = committed.sequence;
  staging.logical_size = 222;
  ASSERT_TRUE(WriteManifest(fd_, &staging, false).ok());  // sequence 3, slot 1
  auto replaced = ReadReplacedManifest(fd_);
  ASSERT_TRUE(replaced.ok() && replaced->has_value());
  EXPECT_EQ((*replaced)->kind, ManifestKind::kBlob);
  EXPECT_EQ((*replaced)->logical_size, 111u);
  EXPECT_EQ((*replaced)->object, committed.object);
  Manifest again = staging;
  again.logical_size = 333;
  ASSERT_TRUE(WriteManifest(fd_, &again, false).ok());  // sequence 4, slot 0: the blob record is gone
  replaced = ReadReplacedManifest(fd_);
  ASSERT_TRUE(replaced.ok() && replaced->has_value());
  EXPECT_EQ((*replaced)->kind, ManifestKind::kStaging);
  EXPECT_EQ((*replaced)->logical_size, 222u);
  // A torn newest slot: the other is the newest, and nothing replaced it.
  std::vector<std::byte> garbage(40, std::byte{0xab});
  ASSERT_EQ(::pwrite(fd_, garbage.data(), garbage.size(), 30), 40);
  replaced = ReadReplacedManifest(fd_);
  ASSERT_TRUE(replaced.ok());
  EXPECT_FALSE(replaced->has_value());
  auto newest = ReadManifest(fd_);
  ASSERT_TRUE(newest.ok() && newest->has_value());
  EXPECT_EQ((*newest)->logical_size, 222u);
}

TEST_F(ManifestFileTest, DurableSlotZeroGivesSlotOnesBlockBack) {
  ASSERT_TRUE(InitEmptyManifest(fd_, true).ok());
  Manifest a = SampleBlobManifest();
  a.sequence = 2;
  a.logical_size = 111;
  ASSERT_TRUE(WriteManifest(fd_, &a, true).ok());  // sequence 3, slot 1 (the staging record)
  struct stat two;
  ASSERT_EQ(::fstat(fd_, &two), 0);
  Manifest b = a;
  b.logical_size = 222;
  ASSERT_TRUE(WriteManifest(fd_, &b, true).ok());  // sequence 4, slot 0 (the commit)
  struct stat one;
  ASSERT_EQ(::fstat(fd_, &one), 0);
  EXPECT_EQ(one.st_size, two.st_size);  // the size stays: slot 1 reads as zeros
  if (two.st_blocks > 8) {  // where holes exist
    EXPECT_LT(one.st_blocks, two.st_blocks);
  }
  auto m = ReadManifest(fd_);
  ASSERT_TRUE(m.ok() && m->has_value());
  EXPECT_EQ((*m)->logical_size, 222u);
  // The next update goes to slot 1 again, and wins.
  Manifest c = b;
  c.logical_size = 333;
  ASSERT_TRUE(WriteManifest(fd_, &c, true).ok());
  m = ReadManifest(fd_);
  ASSERT_TRUE(m.ok() && m->has_value());
  EXPECT_EQ((*m)->logical_size, 333u);
}

TEST_F(ManifestFileTest, ConvertingALongPlainFileDropsItsBytes) {
  auto data = RandomBytes(100000, 4);
  ASSERT_EQ(::pwrite(fd_, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  Manifest m = SampleBlobManifest();
  m.sequence = 0;
  ASSERT_TRUE(WriteManifest(fd_, &m, true).ok());
  struct stat st;
  ASSERT_EQ(::fstat(fd_, &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(2 * Manifest::kSlotSize));
  auto back = ReadManifest(fd_);
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->object, m.object);
}

TEST_F(ManifestFileTest, NewerVersionIsUnsupportedNotPlain) {
  Manifest m = SampleBlobManifest();
  std::vector<std::byte> slot;
  m.EncodeTo(&slot);
  StoreLE16(slot.data() + 8, 9);  // version 9, then fix the checksum
  StoreLE64(slot.data() + slot.size() - 8, Checksum64(ByteSpan(slot).first(slot.size() - 8)));
  ASSERT_EQ(::pwrite(fd_, slot.data(), slot.size(), 0), static_cast<ssize_t>(slot.size()));
  EXPECT_EQ(ReadManifest(fd_).status().code(), StatusCode::kUnsupported);
}

TEST(StagingIdTest, RelPathSplitsAreaAndFile) {
  auto raw = ObjectId::FromHex("0123456789abcdeffedcba9876543210");
  ASSERT_TRUE(raw.ok());
  StagingId id{*raw};
  EXPECT_EQ(id.RelPath(), "staging/0123456789abcdef/fedcba9876543210");
}

}  // namespace
}  // namespace ckptfs::fs
