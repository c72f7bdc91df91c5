// Round trips, random access, determinism and metadata of the blob container.
#include <gtest/gtest.h>

#include <limits>

#include "blob_test_util.h"

namespace ckptfs {
namespace {

using testing::CachedBlob;
using testing::Encode;
using testing::FileBuilder;
using testing::OpenBytes;

std::vector<std::byte> RoundTrip(const FileBuilder& f, const EncodeOptions& options = {}) {
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, options);
  auto reader = OpenBytes(blob);
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  if (!reader.ok()) return {};
  auto all = DecodeAll(**reader);
  EXPECT_TRUE(all.ok()) << all.status().ToString();
  return all.ok() ? *all : std::vector<std::byte>{};
}

FileBuilder CheckpointLike(uint32_t seed, size_t scale = 1) {
  std::vector<std::byte> i64(8 * 33);
  for (size_t i = 0; i < 33; ++i) StoreLE64(i64.data() + 8 * i, i * 1000003);
  FileBuilder f;
  f.Verbatim(AsBytes("PK\x03\x04 header bytes of a checkpoint"))
      .Tensor("model.fc1.weight", DType::kF32, {64 * scale, 100}, testing::NormalF32(6400 * scale, seed))
      .Verbatim(testing::RandomBytes(13, seed))
      .Tensor("model.fc1.bias", DType::kBF16, {777}, testing::NormalBF16(777, seed + 1))
      .Tensor("model.emb", DType::kF16, {1000}, testing::NormalBF16(1000, seed + 2))
      .Tensor("step", DType::kI64, {33}, i64)
      .Tensor("optimizer.exp_avg_sq", DType::kF32, {5000}, std::vector<std::byte>(20000))
      .Verbatim(AsBytes("trailer"));
  return f;
}

TEST(BlobRoundTrip, CheckpointLikeLayoutIsBitExact) {
  FileBuilder f = CheckpointLike(1);
  EXPECT_EQ(RoundTrip(f), f.bytes);
  EXPECT_EQ(RoundTrip(f, EncodeOptions{1, 1000, 1}), f.bytes);
  EXPECT_EQ(RoundTrip(f, EncodeOptions{19, 4096, 2}), f.bytes);
}

TEST(BlobRoundTrip, EmptyAndOneByteFiles) {
  FileBuilder empty;
  EncodeOptions v1;
  v1.blob_version = kBlobVersionRawIndex;
  EXPECT_EQ(Encode(empty.bytes, empty.layout, v1).size(),
            BlobHeader::kEncodedSize + IndexHeader::kEncodedSize + BlobFooter::kEncodedSize);
  std::vector<std::byte> blob = Encode(empty.bytes, empty.layout);  // version 2: the index as a zstd frame
  EXPECT_LT(blob.size(), BlobHeader::kEncodedSize + IndexHeader::kEncodedSize + BlobFooter::kEncodedSize);
  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->logical_size(), 0u);
  EXPECT_TRUE((*reader)->chunks().empty());
  EXPECT_TRUE(DecodeAll(**reader)->empty());
  std::vector<std::byte> nothing;
  EXPECT_TRUE((*reader)->ReadAt(0, nothing).ok());

  FileBuilder one;
  one.Verbatim(AsBytes("x"));
  EXPECT_EQ(RoundTrip(one), one.bytes);
  FileBuilder one_elem;
  one_elem.Tensor("t", DType::kF32, {1}, testing::NormalF32(1, 3));
  EXPECT_EQ(RoundTrip(one_elem), one_elem.bytes);
}

TEST(BlobRoundTrip, SpecialFloatsAndConstantsAreBitExact) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                            -0.0f, 1e-42f, 65504.0f};
  std::vector<std::byte> special(4 * 7 * 300);
  for (size_t i = 0; i < 7 * 300; ++i) std::memcpy(special.data() + 4 * i, &specials[i % 7], 4);
  std::vector<std::byte> constant(4 * 3000);
  for (size_t i = 0; i < 3000; ++i) StoreLE32(constant.data() + 4 * i, 0x3f800000);
  FileBuilder f;
  f.Tensor("special", DType::kF32, {2100}, special)
      .Tensor("ones", DType::kF32, {3000}, constant)
      .Tensor("zeros", DType::kBF16, {999}, std::vector<std::byte>(1998))
      .Tensor("big_endian", DType::kF32, {100}, testing::NormalF32(100, 4));
  f.layout.tensors.back().big_endian = true;
  EXPECT_EQ(RoundTrip(f, EncodeOptions{3, 1024, 1}), f.bytes);
}

TEST(BlobRoundTrip, ChunkBoundariesAtOneElementEitherSide) {
  const uint64_t chunk = 4096;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI64}) {
    const size_t elem = DTypeSize(dtype);
    for (uint64_t bytes : {chunk - elem, chunk, chunk + elem, 2 * chunk - elem, 2 * chunk + elem}) {
      FileBuilder f;
      f.Tensor("t", dtype, {bytes / elem}, testing::NormalF32(bytes / 4 + 1, 5)).layout.segments[0].length = bytes;
      f.bytes.resize(bytes);
      std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, chunk, 1});
      auto reader = OpenBytes(blob);
      ASSERT_TRUE(reader.ok());
      EXPECT_EQ((*reader)->chunks().size(), (bytes + chunk - 1) / chunk) << bytes;
      for (const ChunkInfo& c : (*reader)->chunks()) {
        EXPECT_LE(c.logical_length, chunk);
        EXPECT_EQ(c.logical_length % elem, 0u);
      }
      EXPECT_EQ(*DecodeAll(**reader), f.bytes) << DTypeName(dtype) << " " << bytes;
    }
  }
}

TEST(BlobRoundTrip, OddChunkSizeCutsAtElementBoundaries) {
  FileBuilder f;
  f.Tensor("t", DType::kF32, {1000}, testing::NormalF32(1000, 6));
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 1001, 1});
  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok());
  for (const ChunkInfo& c : (*reader)->chunks()) EXPECT_EQ(c.logical_length, 1000u);
  EXPECT_EQ(*DecodeAll(**reader), f.bytes);
}

TEST(BlobRandomAccess, ReadAtMatchesTheFileOverRandomRanges) {
  FileBuilder f = CheckpointLike(7, 4);
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 3000, 1});
  ChunkCache cache(1 << 20);
  for (ChunkCache* c : {static_cast<ChunkCache*>(nullptr), &cache}) {
    auto reader = OpenBytes(blob, ObjectId::Of(blob), nullptr, c);
    ASSERT_TRUE(reader.ok());
    std::mt19937 rng(8);
    for (int i = 0; i < 300; ++i) {
      uint64_t off = rng() % (f.bytes.size() + 1);
      uint64_t len = rng() % std::min<uint64_t>(f.bytes.size() - off + 1, 20000);
      std::vector<std::byte> out(len);
      ASSERT_TRUE((*reader)->ReadAt(off, out).ok()) << off << "+" << len;
      ASSERT_TRUE(std::equal(out.begin(), out.end(), f.bytes.begin() + off)) << off << "+" << len;
    }
    std::vector<std::byte> one(1);
    EXPECT_EQ((*reader)->ReadAt(f.bytes.size(), one).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*reader)->ReadAt(UINT64_MAX, one).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_GT(cache.size_bytes(), 0u);
}

TEST(BlobRandomAccess, ReadPiecesMatchesTheFileWithAndWithoutCache) {
  FileBuilder f = CheckpointLike(11, 4);
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 3000, 1});
  ChunkCache cache(1 << 14);  // small: pieces must outlive their eviction
  for (ChunkCache* c : {static_cast<ChunkCache*>(nullptr), &cache}) {
    auto reader = OpenBytes(blob, ObjectId::Of(blob), nullptr, c);
    ASSERT_TRUE(reader.ok());
    std::mt19937 rng(12);
    for (int i = 0; i < 200; ++i) {
      uint64_t off = rng() % (f.bytes.size() + 1);
      uint64_t len = rng() % std::min<uint64_t>(f.bytes.size() - off + 1, 40000);
      std::vector<BlobReader::Piece> pieces;
      ASSERT_TRUE((*reader)->ReadPieces(off, len, &pieces).ok()) << off << "+" << len;
      std::vector<std::byte> joined;
      for (const auto& p : pieces) joined.insert(joined.end(), p.data.begin(), p.data.end());
      ASSERT_EQ(joined.size(), len);
      ASSERT_TRUE(std::equal(joined.begin(), joined.end(), f.bytes.begin() + off)) << off << "+" << len;
    }
    std::vector<BlobReader::Piece> none;
    EXPECT_EQ((*reader)->ReadPieces(f.bytes.size(), 1, &none).code(), StatusCode::kInvalidArgument);
  }
}

TEST(BlobRandomAccess, ReadPiecesLetsAChunkGoOnceEveryByteWasReturned) {
  FileBuilder f = CheckpointLike(11, 4);
  CachedBlob b(f, EncodeOptions{3, 3000, 1});
  ASSERT_NE(b.reader, nullptr);
  ChunkCache& cache = b.cache;
  const ObjectId& id = b.id;
  const BlobReader& r = *b.reader;
  const ChunkInfo& c1 = r.chunks()[1];
  ASSERT_GT(c1.logical_length, 2u);
  const uint64_t half = c1.logical_length / 2;
  std::vector<BlobReader::Piece> pieces;
  ASSERT_TRUE(r.ReadPieces(c1.logical_offset, half, &pieces).ok());
  EXPECT_NE(cache.Get(id, 1), nullptr);  // half of it returned: kept
  ASSERT_TRUE(r.ReadPieces(c1.logical_offset + half, c1.logical_length - half, &pieces).ok());
  EXPECT_EQ(cache.Get(id, 1), nullptr);  // all of it returned: gone
  // The pieces still hold the bytes, and a later read decodes the chunk again.
  std::vector<std::byte> joined;
  for (const auto& p : pieces) joined.insert(joined.end(), p.data.begin(), p.data.end());
  EXPECT_TRUE(std::equal(joined.begin(), joined.end(), f.bytes.begin() + c1.logical_offset));
  std::vector<std::byte> out(c1.logical_length);
  ASSERT_TRUE(r.ReadAt(c1.logical_offset, out).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), f.bytes.begin() + c1.logical_offset));
  EXPECT_NE(cache.Get(id, 1), nullptr);  // ReadAt keeps what it decodes
}

TEST(BlobRandomAccess, PrefetchSkipsAChunkAReaderFinishedAfterItWasQueued) {
  CachedBlob b(CheckpointLike(12, 4), EncodeOptions{3, 3000, 1});
  ASSERT_NE(b.reader, nullptr);
  ChunkCache& cache = b.cache;
  const ObjectId& id = b.id;
  const BlobReader& r = *b.reader;
  ASSERT_GE(r.chunks().size(), 3u);
  // A decode queued ahead of the reader, which then reads the chunk itself
  // before the decode starts: the decode is skipped.
  const uint64_t queued = r.prefetch_ticket();
  const ChunkInfo& c1 = r.chunks()[1];
  std::vector<BlobReader::Piece> pieces;
  ASSERT_TRUE(r.ReadPieces(c1.logical_offset, c1.logical_length, &pieces).ok());
  ASSERT_EQ(cache.Get(id, 1), nullptr);
  ASSERT_TRUE(r.Prefetch(1, queued).ok());
  EXPECT_EQ(cache.Get(id, 1), nullptr);
  // Queued after the reader finished with it (a second pass): decoded.
  ASSERT_TRUE(r.Prefetch(1, r.prefetch_ticket()).ok());
  EXPECT_NE(cache.Get(id, 1), nullptr);
  // A chunk a sequential reader went past counts as finished too; one no
  // reader touched is decoded.
  const uint64_t before_drop = r.prefetch_ticket();
  r.DropCached(2);
  ASSERT_TRUE(r.Prefetch(2, before_drop).ok());
  EXPECT_EQ(cache.Get(id, 2), nullptr);
  ASSERT_TRUE(r.Prefetch(0, before_drop).ok());
  EXPECT_NE(cache.Get(id, 0), nullptr);
  EXPECT_EQ(r.Prefetch(static_cast<uint32_t>(r.chunks().size()), 0).code(), StatusCode::kInvalidArgument);
}

TEST(BlobRandomAccess, ReadsFromAFileWithoutContiguousMemory) {
  // A RandomAccessFile that does not expose its bytes (like a PosixFile).
  class Opaque final : public RandomAccessFile {
   public:
    explicit Opaque(std::vector<std::byte> b) : inner_(std::move(b)) {}
    uint64_t Size() const override { return inner_.Size(); }
    Status ReadAt(uint64_t offset, MutableByteSpan out) const override { return inner_.ReadAt(offset, out); }

   private:
    MemoryFile inner_;
  };
  FileBuilder f = CheckpointLike(9);
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 2048, 1});
  auto reader = BlobReader::Open(std::make_shared<Opaque>(blob), std::nullopt, nullptr);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(*DecodeAll(**reader), f.bytes);
}

TEST(BlobDeterminism, SameBytesWhateverTheRunOrThreadCount) {
  FileBuilder f = CheckpointLike(10, 8);
  EncodeOptions one{3, 4096, 1};
  std::vector<std::byte> a = Encode(f.bytes, f.layout, one);
  EXPECT_EQ(a, Encode(f.bytes, f.layout, one));
  EXPECT_EQ(a, Encode(f.bytes, f.layout, EncodeOptions{3, 4096, 2}));
  EXPECT_EQ(a, Encode(f.bytes, f.layout, EncodeOptions{3, 4096, 5}));
}

// A file large enough for the whole-file checksum to be hashed on a thread
// of its own on several threads (blob_writer.cc): the same blob, and it
// decodes with its checksum checked.
TEST(BlobDeterminism, ALargeFileIsTheSameBlobOnOneOrTwoThreads) {
  FileBuilder f = CheckpointLike(11, 700);
  ASSERT_GE(f.bytes.size(), size_t{16} << 20);
  std::vector<std::byte> one = Encode(f.bytes, f.layout, EncodeOptions{1, 4 << 20, 1});
  EXPECT_EQ(one, Encode(f.bytes, f.layout, EncodeOptions{1, 4 << 20, 2}));
  auto reader = OpenBytes(one);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto all = DecodeAll(**reader);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, f.bytes);
}

TEST(BlobMetadata, IndexDescribesTheFile) {
  FileBuilder f = CheckpointLike(11);
  f.layout.format = FileFormat::kTorchZip;
  EncodeStats stats;
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 4096, 1}, nullptr, &stats);
  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok());
  const BlobReader& r = **reader;
  EXPECT_EQ(r.format(), FileFormat::kTorchZip);
  EXPECT_EQ(r.logical_size(), f.bytes.size());
  EXPECT_EQ(r.stored_size(), blob.size());
  EXPECT_EQ(r.file_checksum(), Checksum64(f.bytes));
  EXPECT_FALSE(r.base().has_value());
  EXPECT_EQ(stats.logical_bytes, f.bytes.size());
  EXPECT_EQ(stats.stored_bytes, blob.size());
  EXPECT_EQ(stats.chunks, r.chunks().size());
  EXPECT_FALSE(stats.uses_base);
  ASSERT_EQ(r.tensors().size(), f.layout.tensors.size());
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    EXPECT_EQ(r.tensors()[i].name, f.layout.tensors[i].name);
    EXPECT_EQ(r.tensors()[i].dtype, f.layout.tensors[i].dtype);
    EXPECT_EQ(r.tensors()[i].shape, f.layout.tensors[i].shape);
  }
  ASSERT_EQ(r.segments().size(), f.layout.segments.size());
  for (size_t s = 0; s < r.segments().size(); ++s) {
    const SegmentInfo& seg = r.segments()[s];
    EXPECT_EQ(seg.offset, f.layout.segments[s].offset);
    EXPECT_EQ(seg.tensor, f.layout.segments[s].tensor);
    for (uint32_t c = seg.first_chunk; c < seg.first_chunk + seg.chunk_count; ++c) {
      EXPECT_EQ(r.chunks()[c].segment, static_cast<int32_t>(s));
      EXPECT_EQ(r.chunks()[c].checksum,
                Checksum64(ByteSpan(f.bytes).subspan(r.chunks()[c].logical_offset, r.chunks()[c].logical_length)));
      EXPECT_TRUE(r.VerifyChunk(c).ok());
    }
  }
  EXPECT_EQ(r.VerifyChunk(static_cast<uint32_t>(r.chunks().size())).code(), StatusCode::kInvalidArgument);
  // The zero tensor is stored as nothing; the floats as byte planes.
  bool saw_zeros = false, saw_planes = false;
  for (const ChunkInfo& c : r.chunks()) {
    saw_zeros |= c.codec == ChunkCodec::kZeros;
    saw_planes |= c.codec == ChunkCodec::kBytePlaneZstd;
  }
  EXPECT_TRUE(saw_zeros);
  EXPECT_TRUE(saw_planes);
}

TEST(BlobEncode, RejectsInvalidLayoutsAndOptions) {
  FileBuilder f = CheckpointLike(12);
  VectorSink sink;
  Layout short_layout = f.layout;
  short_layout.segments.pop_back();
  EXPECT_FALSE(EncodeBlob(f.bytes, short_layout, nullptr, {}, &sink).ok());
  EXPECT_EQ(EncodeBlob(f.bytes, f.layout, nullptr, EncodeOptions{3, 0, 1}, &sink).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeBlob(f.bytes, f.layout, nullptr, EncodeOptions{99, 4096, 1}, &sink).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(BlobEncode, SinkErrorsPropagate) {
  class FailingSink final : public ByteSink {
   public:
    Status Append(ByteSpan) override { return Status::NoSpace("disk full"); }
  } sink;
  FileBuilder f = CheckpointLike(13);
  EXPECT_EQ(EncodeBlob(f.bytes, f.layout, nullptr, {}, &sink).status().code(), StatusCode::kNoSpace);
}

}  // namespace
}  // namespace ckptfs
