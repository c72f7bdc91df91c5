#include "fs/read_ahead.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "codec/policy/policy.h"
#include "fs/next_tensor.h"
#include "tests/unit/codec/adam_run_test_util.h"
#include "tests/unit/codec/blob_test_util.h"

namespace ckptfs::fs {
namespace {

// torch.save stores records sorted as text keys; torch.load (and the
// layout's tensor list) follows the pickle: key 0, 1, 2, ...
const std::vector<int> kTextOrderKeys = {0, 1, 10, 11, 2, 3, 4, 5, 6, 7, 8, 9};

// Verbatim bytes (a zip header) before each tensor record, as in a zip.
ckptfs::testing::FileBuilder TorchLikeFile(uint64_t tensor_bytes) {
  ckptfs::testing::FileBuilder b;
  std::vector<std::byte> header(64, std::byte{0x50});
  b.layout.format = FileFormat::kTorchZip;
  b.layout.tensors.resize(kTextOrderKeys.size());
  for (int key : kTextOrderKeys) {
    b.Verbatim(header);
    std::vector<std::byte> data = ckptfs::testing::NormalF32(tensor_bytes / 4, static_cast<uint32_t>(key));
    b.layout.tensors[key] = TensorInfo{std::to_string(key), DType::kF32, {tensor_bytes / 4}, false};
    b.layout.segments.push_back(Segment{b.bytes.size(), data.size(), key});
    b.bytes.insert(b.bytes.end(), data.begin(), data.end());
  }
  b.Verbatim(header);
  return b;
}

std::vector<SegmentInfo> SegmentsOf(const Layout& layout) {
  std::vector<SegmentInfo> out;
  for (const Segment& s : layout.segments) out.push_back(SegmentInfo{s.offset, s.length, s.tensor, 0, 0});
  return out;
}

int32_t SegmentOfTensor(const std::vector<SegmentInfo>& segments, int32_t tensor) {
  for (size_t s = 0; s < segments.size(); ++s)
    if (segments[s].tensor == tensor) return static_cast<int32_t>(s);
  return -1;
}

TEST(NextTensorTest, TorchZipFollowsPickleOrderNotFileOrder) {
  const std::vector<SegmentInfo> segments = SegmentsOf(TorchLikeFile(64).layout);
  for (int32_t t = 0; t + 1 < static_cast<int32_t>(kTextOrderKeys.size()); ++t)
    EXPECT_EQ(PredictNextTensorSegment(FileFormat::kTorchZip, segments, SegmentOfTensor(segments, t)),
              SegmentOfTensor(segments, t + 1))
        << "after tensor " << t;
  EXPECT_EQ(PredictNextTensorSegment(FileFormat::kTorchZip, segments, SegmentOfTensor(segments, 11)), -1);
  EXPECT_EQ(PredictNextTensorSegment(FileFormat::kTorchZip, segments, 0), -1);  // a zip header
}

TEST(NextTensorTest, OtherFormatsFollowFileOrder) {
  const std::vector<SegmentInfo> segments = SegmentsOf(TorchLikeFile(64).layout);
  // Segment 3 holds tensor 1, segment 5 the next one in the file (tensor 10).
  ASSERT_EQ(segments[3].tensor, 1);
  EXPECT_EQ(PredictNextTensorSegment(FileFormat::kSafetensors, segments, 3), 5);
  EXPECT_EQ(PredictNextTensorSegment(FileFormat::kSafetensors, segments, 23), -1);  // the last tensor
}

EncodeOptions ChunkBytes(uint64_t chunk_bytes) {
  EncodeOptions options;
  options.chunk_bytes = chunk_bytes;
  return options;
}

// Polls the cache: the decodes run on ReadAhead's worker.
bool EventuallyCached(ChunkCache& cache, const ObjectId& id, uint32_t chunk) {
  for (int i = 0; i < 2000; ++i) {
    if (cache.Get(id, chunk) != nullptr) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(ReadAheadTest, DecodesTheNextStorageInPickleOrderBeforeItIsRead) {
  constexpr uint64_t kChunk = 64 << 10;
  ckptfs::testing::CachedBlob b(TorchLikeFile(4 * kChunk), ChunkBytes(kChunk), 64 << 20);
  ASSERT_NE(b.reader, nullptr);
  ChunkCache& cache = b.cache;
  const ObjectId& id = b.id;
  const std::shared_ptr<const BlobReader>& reader = b.reader;
  const BlobReader& r = *reader;
  const int32_t one = SegmentOfTensor(r.segments(), 1);
  const int32_t two = SegmentOfTensor(r.segments(), 2);
  const int32_t ten = SegmentOfTensor(r.segments(), 10);
  ASSERT_GE(r.segments()[one].chunk_count, 2u);

  // A window of 6 chunks: reading tensor 1 (4 chunks) leaves room for the
  // first chunks of the tensor after it.
  ReadAhead ahead(1, 6 * kChunk, 32 << 20);
  ReadAhead::Stream stream;
  const SegmentInfo& seg = r.segments()[one];
  ahead.OnRead(stream, reader, seg.offset, kChunk);
  ahead.OnRead(stream, reader, seg.offset + kChunk, kChunk);

  EXPECT_TRUE(EventuallyCached(cache, id, r.segments()[two].first_chunk));
  EXPECT_GT(ahead.predicted_queued(), 0u);
  // The record after it in the file is not read next: not decoded.
  EXPECT_EQ(cache.Get(id, r.segments()[ten].first_chunk), nullptr);

  // The reader goes to tensor 2: the run takes the prediction over and
  // does not queue its chunks again.
  const uint64_t queued = ahead.predicted_queued();
  const SegmentInfo& next = r.segments()[two];
  ahead.OnRead(stream, reader, next.offset, kChunk);
  ahead.OnRead(stream, reader, next.offset + kChunk, kChunk);
  EXPECT_TRUE(EventuallyCached(cache, id, next.first_chunk + 3));
  EXPECT_GT(ahead.predicted_queued(), queued);  // tensor 3's first chunks
  ahead.Close(stream);
}

TEST(ReadAheadTest, DropsChunksByBytesBehindTheReaderNotByChunkCount) {
  // A big tensor, many tiny records after it (as a torch.save file puts
  // biases and headers between weights), then another big tensor.
  constexpr uint64_t kChunk = 64 << 10;
  ckptfs::testing::FileBuilder b;
  b.layout.format = FileFormat::kTorchZip;
  auto add_tensor = [&](uint64_t bytes, uint32_t seed) {
    std::vector<std::byte> data = ckptfs::testing::NormalF32(bytes / 4, seed);
    const int32_t t = static_cast<int32_t>(b.layout.tensors.size());
    b.layout.tensors.push_back(TensorInfo{std::to_string(t), DType::kF32, {bytes / 4}, false});
    b.layout.segments.push_back(Segment{b.bytes.size(), data.size(), t});
    b.bytes.insert(b.bytes.end(), data.begin(), data.end());
  };
  add_tensor(2 * kChunk, 1);
  for (uint32_t i = 0; i < 16; ++i) add_tensor(64, 10 + i);
  add_tensor(4 * kChunk, 2);
  ckptfs::testing::CachedBlob blob(b, ChunkBytes(kChunk), 64 << 20);
  ASSERT_NE(blob.reader, nullptr);
  ChunkCache& cache = blob.cache;
  const ObjectId& id = blob.id;
  const BlobReader& r = *blob.reader;
  const std::vector<ChunkInfo>& chunks = r.chunks();
  const uint32_t big = ChunkIndexAt(chunks, 2 * kChunk + 16 * 64);
  ASSERT_GE(big, 2u + 16u) << "each tiny record in a chunk of its own";

  // No decoding ahead (window 0); chunks that end two chunks' bytes
  // behind the furthest read leave the cache.
  ReadAhead ahead(1, 0, 2 * kChunk);
  ReadAhead::Stream stream;
  auto read = [&](uint64_t offset, uint64_t length) {
    std::vector<BlobReader::Piece> pieces;
    ASSERT_TRUE(r.ReadPieces(offset, length, &pieces).ok());
    ahead.OnRead(stream, blob.reader, offset, length);
  };
  // Half of chunk 1 (the end of the first tensor): it stays cached.
  read(kChunk, kChunk / 2);
  read(kChunk + kChunk / 2, 16);
  ASSERT_NE(cache.Get(id, 1), nullptr);
  // The kernel's read-ahead reads the tiny records and the start of the
  // next tensor: many chunks, few bytes past chunk 1. Chunk 1 stays
  // (the reader's own read of its second half comes later).
  read(2 * kChunk, 16 * 64 + kChunk / 2);
  EXPECT_GT(ChunkIndexAt(chunks, 2 * kChunk + 16 * 64 + kChunk / 2 - 1), 1u + 8u);
  EXPECT_NE(cache.Get(id, 1), nullptr);
  // Far past it: dropped.
  read(2 * kChunk + 16 * 64 + kChunk / 2, 2 * kChunk);
  EXPECT_EQ(cache.Get(id, 1), nullptr);
  ahead.Close(stream);
}

TEST(ReadAheadTest, AnOpenFileKeepsTheStateItsWeightsDecodedAheadUntilClosed) {
  // Two versions of a small Adam run: the second's weights are predicted
  // from its optimizer state, which the file holds after them.
  using namespace ckptfs::testing;  // NOLINT(google-build-using-namespace)
  const policy::Policy policy = policy::Policy::Defaults(1e-2, std::nullopt);
  const EncodeOptions options = DefaultLossy(policy, /*predict=*/true);
  AdamRun run;
  MapResolver resolver;
  std::vector<ObjectId> ids;
  std::vector<std::vector<std::byte>> blobs;
  std::shared_ptr<const BlobReader> previous;
  ASSERT_TRUE(AppendVersion(run.File(), options, 0, &resolver, &ids, &previous, &blobs).has_value());
  run.Steps(5);
  ASSERT_TRUE(AppendVersion(run.File(), options, 1, &resolver, &ids, &previous, &blobs).has_value());

  ChunkCache cache(32 << 10, 0, 4 << 20);
  Result<std::shared_ptr<const BlobReader>> opened = OpenBytes(blobs.back(), ids.back(), &resolver, &cache);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const std::shared_ptr<const BlobReader>& reader = *opened;
  ReadAhead ahead(1, 0, 8 << 20);
  ReadAhead::Stream stream;
  // The reader's first read of the weights (as the mount does: OnRead,
  // then the read itself) decodes state ahead of it, which waits.
  const uint64_t first = reader->segments()[1].offset;
  ahead.OnRead(stream, reader, first, 4096);
  std::vector<BlobReader::Piece> pieces;
  ASSERT_TRUE(reader->ReadPieces(first, 4096, &pieces).ok());
  EXPECT_GT(cache.awaited_bytes(), 0u);
  // The same read without an open stream (no OnRead) keeps nothing aside.
  ChunkCache other(32 << 10, 0, 4 << 20);
  Result<std::shared_ptr<const BlobReader>> plain = OpenBytes(blobs.back(), ids.back(), &resolver, &other);
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->ReadPieces(first, 4096, &pieces).ok());
  EXPECT_EQ(other.awaited_bytes(), 0u);
  // Closing the file lets them go to the LRU, which evicts to its size.
  ahead.Close(stream);
  EXPECT_EQ(cache.awaited_bytes(), 0u);
  EXPECT_LE(cache.size_bytes(), 32u << 10);
}

}  // namespace
}  // namespace ckptfs::fs
