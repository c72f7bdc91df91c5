// Hostile and damaged blobs: every failure is a clean error, never a crash
// and never silently wrong bytes.
#include <gtest/gtest.h>
#include <zstd.h>

#include <set>

#include "blob_test_util.h"

namespace ckptfs {
namespace {

using testing::Encode;
using testing::FileBuilder;
using testing::OpenBytes;
using testing::RewriteBlob;

FileBuilder SmallFile() {
  std::string text(300, 'k');
  for (size_t i = 0; i < text.size(); i += 3) text[i] = static_cast<char>('a' + i % 11);
  FileBuilder f;
  f.Verbatim(AsBytes(text))
      .Tensor("w", DType::kF32, {200}, testing::NormalF32(200, 1))
      .Tensor("z", DType::kBF16, {64}, std::vector<std::byte>(128))
      .Tensor("r", DType::kU8, {40}, testing::RandomBytes(40, 2));
  return f;
}

// OK only if the blob opens and decodes to exactly `want`.
Status OpenAndDecode(std::vector<std::byte> blob, const std::vector<std::byte>& want, const DecodeLimits& limits = {}) {
  auto reader = OpenBytes(std::move(blob), std::nullopt, nullptr, nullptr, limits);
  if (!reader.ok()) return reader.status();
  for (uint32_t c = 0; c < (*reader)->chunks().size(); ++c) RETURN_IF_ERROR((*reader)->VerifyChunk(c));
  auto all = DecodeAll(**reader);
  if (!all.ok()) return all.status();
  if (*all != want) return Status::Internal("WRONG BYTES returned as OK");
  return Status::Ok();
}

TEST(BlobCorruption, EveryByteFlipIsDetected) {
  FileBuilder f = SmallFile();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 256, 1});
  ASSERT_TRUE(OpenAndDecode(blob, f.bytes).ok());
  for (size_t i = 0; i < blob.size(); ++i) {
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      std::vector<std::byte> bad = blob;
      bad[i] ^= std::byte{mask};
      Status s = OpenAndDecode(bad, f.bytes);
      ASSERT_FALSE(s.ok()) << "flip of byte " << i << " mask " << int{mask} << " of " << blob.size();
      ASSERT_NE(s.code(), StatusCode::kInternal) << s.ToString();
    }
  }
}

TEST(BlobCorruption, EveryTruncationAndExtensionFails) {
  FileBuilder f = SmallFile();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 256, 1});
  for (size_t n = 0; n < blob.size(); ++n) {
    Status s = OpenAndDecode(std::vector<std::byte>(blob.begin(), blob.begin() + n), f.bytes);
    ASSERT_FALSE(s.ok()) << n;
  }
  std::vector<std::byte> longer = blob;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(OpenAndDecode(longer, f.bytes).ok());
  longer = blob;
  longer.insert(longer.begin() + BlobHeader::kEncodedSize, std::byte{0});
  EXPECT_FALSE(OpenAndDecode(longer, f.bytes).ok());
}

TEST(BlobCorruption, DamagedChunkErrorNamesTheChunk) {
  FileBuilder f = SmallFile();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 256, 1});
  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok());
  const ChunkInfo& c = (*reader)->chunks()[2];
  ASSERT_GT(c.stored_length, 0u);
  blob[c.stored_offset] ^= std::byte{4};
  auto damaged = OpenBytes(blob);
  ASSERT_TRUE(damaged.ok()) << "payload damage is found on read, not at open";
  Status s = DecodeAll(**damaged).status();
  EXPECT_EQ(s.code(), StatusCode::kChecksumMismatch);
  EXPECT_NE(s.message().find("chunk 2 at logical offset " + std::to_string(c.logical_offset)), std::string::npos)
      << s.message();
  // Streamed decodes fail alike, on one thread or several.
  for (unsigned threads : {1u, 2u, 3u}) {
    VectorSink sink;
    Status streamed = DecodeToSink(**damaged, &sink, threads, 1);
    EXPECT_EQ(streamed.code(), StatusCode::kChecksumMismatch) << threads;
    EXPECT_NE(streamed.message().find("chunk 2 at logical offset"), std::string::npos) << streamed.message();
  }
  // The chunks before it still read.
  std::vector<std::byte> head(c.logical_offset);
  EXPECT_TRUE((*damaged)->ReadAt(0, head).ok());
  EXPECT_EQ((*damaged)->VerifyChunk(2).code(), StatusCode::kChecksumMismatch);
}

// A sink that fails stops a streamed decode with its error, on any number
// of threads (no thread is left waiting).
TEST(BlobCorruption, AFailingSinkStopsAStreamedDecode) {
  FileBuilder f = SmallFile();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 256, 1});
  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok());
  ASSERT_GT((*reader)->chunks().size(), 3u);
  class FailingSink final : public ByteSink {
   public:
    int appends = 0;
    Status Append(ByteSpan) override {
      return ++appends == 2 ? Status::Io(5, "write out: device error") : Status::Ok();
    }
  };
  for (unsigned threads : {1u, 2u, 4u}) {
    FailingSink sink;
    Status s = DecodeToSink(**reader, &sink, threads, 1);
    EXPECT_EQ(s.code(), StatusCode::kIo) << threads;
    EXPECT_EQ(sink.appends, 2) << "nothing is appended after the failure";
  }
}

// A chunk whose stored bytes are intact but whose decoded bytes are not what
// was written (a decoder bug, a different machine): the decoded checksum
// catches it on every decode path, including the byte-plane path that hashes
// its output block by block as it decodes, and a delta chunk's XOR.
TEST(BlobCorruption, AWrongDecodedChecksumIsFoundOnEveryDecodePath) {
  std::vector<std::byte> weights = testing::NormalF32(30000, 5);
  for (size_t i = 0; i < 30000; ++i) {  // noisy low mantissa bytes, as in trained weights
    weights[4 * i] = static_cast<std::byte>(i * 131 + 7);
    weights[4 * i + 1] = static_cast<std::byte>((i * 2654435761u) >> 13);
  }
  std::string text(3000, 'v');
  FileBuilder f;
  f.Verbatim(AsBytes(text)).Tensor("w", DType::kF32, {30000}, weights).Tensor("h", DType::kBF16, {9000},
                                                                                testing::NormalBF16(9000, 6));
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 32 << 10, 1});
  auto reader = OpenBytes(blob);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::set<ChunkCodec> codecs;
  for (size_t c = 0; c < (*reader)->chunks().size(); ++c) {
    codecs.insert((*reader)->chunks()[c].codec);
    // Intact, every chunk verifies (the block-by-block hash equals the whole one).
    ASSERT_TRUE((*reader)->VerifyChunk(static_cast<uint32_t>(c)).ok()) << "chunk " << c;
    std::vector<std::byte> bad = RewriteBlob(blob, [&](BlobIndex& index, auto&) { index.chunks[c].checksum ^= 1; });
    auto damaged = OpenBytes(bad);
    ASSERT_TRUE(damaged.ok()) << damaged.status().ToString();
    Status s = (*damaged)->VerifyChunk(static_cast<uint32_t>(c));
    EXPECT_EQ(s.code(), StatusCode::kChecksumMismatch) << "chunk " << c << ": " << s.ToString();
    EXPECT_NE(s.message().find("decoded bytes checksum"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(codecs.count(ChunkCodec::kBytePlaneZstd)) << "no byte-plane chunk to test";
}

TEST(BlobCorruption, DecompressionBombInAChunkIsRefusedBeforeInflating) {
  FileBuilder f;
  std::string text(5000, 'q');
  f.Verbatim(AsBytes(text));
  std::vector<std::byte> blob = Encode(f.bytes, f.layout);
  std::vector<std::byte> big(64 << 20);
  std::vector<std::byte> bomb(ZSTD_compressBound(big.size()));
  bomb.resize(ZSTD_compress(bomb.data(), bomb.size(), big.data(), big.size(), 1));
  std::vector<std::byte> hostile = RewriteBlob(blob, [&](BlobIndex& index, auto& payloads) {
    ASSERT_EQ(index.chunks[0].codec, ChunkCodec::kZstd);
    payloads[0] = bomb;
  });
  auto reader = OpenBytes(hostile);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Status s = DecodeAll(**reader).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("chunk 0"), std::string::npos) << s.message();
}

TEST(BlobCorruption, DeclaredSizesAreBoundedByTheLimits) {
  FileBuilder f = SmallFile();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 256, 1});
  DecodeLimits limits;
  limits.max_chunk_bytes = 255;
  EXPECT_EQ(OpenAndDecode(blob, f.bytes, limits).code(), StatusCode::kCorruption);
  limits = {};
  limits.max_logical_size = f.bytes.size() - 1;
  EXPECT_EQ(OpenAndDecode(blob, f.bytes, limits).code(), StatusCode::kCorruption);
  limits = {};
  limits.max_index_bytes = 100;
  EXPECT_EQ(OpenAndDecode(blob, f.bytes, limits).code(), StatusCode::kCorruption);
  EXPECT_TRUE(OpenAndDecode(blob, f.bytes).ok());
}

TEST(BlobCorruption, WellChecksummedButInconsistentIndexesAreRejected) {
  FileBuilder f = SmallFile();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 256, 1});
  using Edit = std::function<void(BlobIndex&, std::vector<std::vector<std::byte>>&)>;
  struct Case {
    const char* what;
    Edit edit;
    StatusCode want;
  };
  const std::vector<Case> cases = {
      {"huge chunk count", [](BlobIndex& i, auto&) { i.header.chunk_count = 0xffffffff; }, StatusCode::kCorruption},
      {"huge tensor count", [](BlobIndex& i, auto&) { i.header.tensor_count = 0x7fffffff; }, StatusCode::kCorruption},
      {"logical size too big", [](BlobIndex& i, auto&) { i.header.logical_size += 1; }, StatusCode::kCorruption},
      {"segment gap", [](BlobIndex& i, auto&) { i.segments[1].offset += 4; }, StatusCode::kCorruption},
      {"segment names a missing tensor", [](BlobIndex& i, auto&) { i.segments[1].tensor = 9; },
       StatusCode::kCorruption},
      {"segment tensor below -1", [](BlobIndex& i, auto&) { i.segments[1].tensor = -2; }, StatusCode::kCorruption},
      {"chunk past its segment",
       [](BlobIndex& i, auto&) { i.chunks[i.segments[0].first_chunk].logical_length += 1; }, StatusCode::kCorruption},
      {"unknown codec", [](BlobIndex& i, auto&) { i.chunks[0].codec = static_cast<ChunkCodec>(17); },
       StatusCode::kUnsupported},
      {"byte planes on verbatim bytes", [](BlobIndex& i, auto&) { i.chunks[0].codec = ChunkCodec::kBytePlaneZstd; },
       StatusCode::kCorruption},
      {"delta without a base", [](BlobIndex& i, auto&) {
         i.chunks[i.segments[1].first_chunk].codec = ChunkCodec::kBytePlaneXorZstd;
       }, StatusCode::kCorruption},
      {"zstd-base without a base", [](BlobIndex& i, auto&) { i.chunks[0].codec = ChunkCodec::kZstdWithBase; },
       StatusCode::kCorruption},
      {"base offset on a key chunk", [](BlobIndex& i, auto&) { i.base_offsets[0] = 8; }, StatusCode::kCorruption},
      {"raw chunk of the wrong size", [](BlobIndex& i, auto& p) {
         for (size_t c = 0; c < i.chunks.size(); ++c)
           if (i.chunks[c].codec == ChunkCodec::kRaw) p[c].pop_back();
       }, StatusCode::kCorruption},
      {"zeros chunk with bytes", [](BlobIndex& i, auto& p) {
         for (size_t c = 0; c < i.chunks.size(); ++c)
           if (i.chunks[c].codec == ChunkCodec::kZeros) p[c].push_back(std::byte{0});
       }, StatusCode::kCorruption},
      {"bad dtype", [](BlobIndex& i, auto&) { i.tensors[0].dtype = static_cast<DType>(200); }, StatusCode::kCorruption},
      {"base id flag without id", [](BlobIndex& i, auto&) { i.header.base = ObjectId{}; }, StatusCode::kCorruption},
      {"params on a lossless chunk", [](BlobIndex& i, auto&) { i.params[0] = {std::byte{1}}; },
       StatusCode::kCorruption},
      {"payload bytes no chunk owns", [](BlobIndex&, auto& p) { p.push_back({std::byte{1}}); },
       StatusCode::kCorruption},
  };
  for (const Case& c : cases) {
    std::vector<std::byte> hostile = RewriteBlob(blob, c.edit);
    Status s = OpenAndDecode(hostile, f.bytes);
    EXPECT_EQ(s.code(), c.want) << c.what << ": " << s.ToString();
  }
  // The rewriter itself is faithful.
  EXPECT_TRUE(OpenAndDecode(RewriteBlob(blob, [](BlobIndex&, auto&) {}), f.bytes).ok());
}

TEST(BlobCorruption, NewerVersionIsUnsupported) {
  FileBuilder f = SmallFile();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout);
  std::vector<std::byte> newer = blob;
  StoreLE16(newer.data() + 8, 3);
  EXPECT_EQ(OpenAndDecode(newer, f.bytes).code(), StatusCode::kUnsupported);
  newer = blob;
  StoreLE16(newer.data() + newer.size() - 16, 3);
  EXPECT_EQ(OpenAndDecode(newer, f.bytes).code(), StatusCode::kUnsupported);
}

// Version 2 stores the index as a zstd frame, version 1 as it is; both
// decode, and the two ends must agree on which.
TEST(BlobCorruption, IndexStorageFollowsTheVersion) {
  FileBuilder f = SmallFile();
  EncodeOptions v1;
  v1.blob_version = kBlobVersionRawIndex;
  const std::vector<std::byte> raw = Encode(f.bytes, f.layout, v1);
  const std::vector<std::byte> zstd = Encode(f.bytes, f.layout);
  EXPECT_TRUE(OpenAndDecode(raw, f.bytes).ok());
  EXPECT_TRUE(OpenAndDecode(zstd, f.bytes).ok());
  EXPECT_LT(zstd.size(), raw.size());
  EXPECT_EQ(LoadLE16(raw.data() + 8), 1u);
  EXPECT_EQ(LoadLE16(zstd.data() + 8), 2u);
  // The payloads are the same bytes; only the index's storage differs.
  const uint64_t payload_end = LoadLE64(raw.data() + raw.size() - 40);
  EXPECT_EQ(LoadLE64(zstd.data() + zstd.size() - 40), payload_end);
  EXPECT_TRUE(std::equal(raw.begin() + 8 + 8, raw.begin() + payload_end, zstd.begin() + 8 + 8));

  // One end says 1 and the other 2: Corruption, not a misread index.
  for (const std::vector<std::byte>* b : {&raw, &zstd}) {
    std::vector<std::byte> mixed = *b;
    StoreLE16(mixed.data() + 8, LoadLE16(mixed.data() + 8) == 1 ? 2 : 1);
    EXPECT_EQ(OpenAndDecode(mixed, f.bytes).code(), StatusCode::kCorruption);
  }
  // A raw index read as a frame, and a frame read as a raw index (both ends
  // rewritten, the checksum still right): Corruption.
  for (const std::vector<std::byte>* b : {&raw, &zstd}) {
    std::vector<std::byte> swapped = *b;
    const uint16_t other = LoadLE16(swapped.data() + 8) == 1 ? 2 : 1;
    StoreLE16(swapped.data() + 8, other);
    StoreLE16(swapped.data() + swapped.size() - 16, other);
    EXPECT_EQ(OpenAndDecode(swapped, f.bytes).code(), StatusCode::kCorruption);
  }
  // A frame whose content would exceed the reader's index limit.
  DecodeLimits tight;
  tight.max_index_bytes = static_cast<uint32_t>(LoadLE64(zstd.data() + zstd.size() - 32));  // the stored size
  EXPECT_EQ(OpenAndDecode(zstd, f.bytes, tight).code(), StatusCode::kCorruption);
}

TEST(ChunkCacheTest, EvictsLeastRecentlyUsedByBytes) {
  ChunkCache cache(300);
  ObjectId a = ObjectId::Of(AsBytes("a")), b = ObjectId::Of(AsBytes("b"));
  auto chunk = [](size_t n, uint8_t v) {
    auto buffer = std::make_shared<ChunkBuffer>();
    buffer->Resize(n);
    std::fill_n(buffer->data(), n, std::byte{v});
    return std::shared_ptr<const ChunkBuffer>(std::move(buffer));
  };
  cache.Put(a, 0, chunk(100, 1));
  cache.Put(a, 1, chunk(100, 2));
  cache.Put(b, 0, chunk(100, 3));
  EXPECT_EQ(cache.size_bytes(), 300u);
  ASSERT_NE(cache.Get(a, 0), nullptr);  // a/0 is now the most recent
  cache.Put(b, 1, chunk(100, 4));       // evicts a/1, the least recent
  EXPECT_EQ(cache.Get(a, 1), nullptr);
  EXPECT_EQ(cache.Get(a, 0)->data()[0], std::byte{1});
  EXPECT_EQ(cache.Get(b, 0)->data()[0], std::byte{3});
  EXPECT_EQ(cache.size_bytes(), 300u);
  cache.Put(b, 0, chunk(50, 5));  // replacing an entry updates its size
  EXPECT_EQ(cache.size_bytes(), 250u);
  cache.Put(a, 7, chunk(301, 6));  // larger than the cache: not kept
  EXPECT_EQ(cache.Get(a, 7), nullptr);
  EXPECT_EQ(cache.size_bytes(), 250u);
}

TEST(ChunkCacheTest, ReadersShareItAndHitIt) {
  FileBuilder f = SmallFile();
  std::vector<std::byte> blob = Encode(f.bytes, f.layout, EncodeOptions{3, 256, 1});
  ChunkCache cache(1 << 20);
  ObjectId id = ObjectId::Of(blob);
  auto reader = OpenBytes(blob, id, nullptr, &cache);
  ASSERT_TRUE(reader.ok());
  std::vector<std::byte> out(10);
  ASSERT_TRUE((*reader)->ReadAt(0, out).ok());
  auto cached = cache.Get(id, 0);
  ASSERT_NE(cached, nullptr);
  EXPECT_EQ(cached->size(), (*reader)->chunks()[0].logical_length);
  EXPECT_TRUE(std::equal(cached->data(), cached->data() + cached->size(), f.bytes.begin()));
}

TEST(ChunkCacheTest, RecyclesBuffersOnceNobodyHoldsThem) {
  ChunkCache cache(200);
  ObjectId a = ObjectId::Of(AsBytes("a"));
  auto first = cache.AcquireBuffer(100);
  ASSERT_EQ(first->size(), 100u);
  const std::byte* first_memory = first->data();
  cache.Put(a, 0, first);
  first.reset();
  auto held = cache.AcquireBuffer(100);
  const std::byte* held_memory = held->data();
  cache.Put(a, 1, held);  // `held` keeps a reference, as a reader would
  // The cache is full: acquiring evicts a/0, which nobody holds, and
  // lends its buffer.
  cache.Put(a, 2, cache.AcquireBuffer(100));
  EXPECT_EQ(cache.Get(a, 0), nullptr);
  EXPECT_EQ(cache.Get(a, 2)->data(), first_memory);
  cache.Put(a, 3, cache.AcquireBuffer(100));  // evicts a/1: still held, so new memory
  EXPECT_EQ(cache.Get(a, 1), nullptr);
  EXPECT_NE(cache.Get(a, 3)->data(), held_memory);
  EXPECT_EQ(held->data(), held_memory);
  held.reset();  // cached 200 of 200: freed, not kept
  EXPECT_EQ(cache.idle_bytes(), 0u);
  cache.Drop(a, 3);
  cache.Drop(a, 2);
  EXPECT_EQ(cache.size_bytes(), 0u);
  EXPECT_EQ(cache.idle_bytes(), 200u);
  auto next = cache.AcquireBuffer(70);  // the most recently idle one
  EXPECT_EQ(next->size(), 70u);
  EXPECT_EQ(next->data(), first_memory);
  EXPECT_EQ(cache.idle_bytes(), 100u);
}

TEST(ChunkCacheTest, IdleAndCachedBytesStayWithinTheCapacity) {
  ChunkCache cache(300);
  ObjectId a = ObjectId::Of(AsBytes("a"));
  std::vector<std::shared_ptr<ChunkBuffer>> lent;
  for (int i = 0; i < 5; ++i) lent.push_back(cache.AcquireBuffer(100));
  lent.clear();  // five let go, three kept
  EXPECT_EQ(cache.idle_bytes(), 300u);
  cache.Put(a, 0, cache.AcquireBuffer(100));
  cache.Put(a, 1, cache.AcquireBuffer(100));
  EXPECT_EQ(cache.size_bytes() + cache.idle_bytes(), 300u);
  auto fresh = std::make_shared<ChunkBuffer>();  // memory from elsewhere
  fresh->Resize(100);
  cache.Put(a, 2, fresh);
  EXPECT_EQ(cache.size_bytes(), 300u);
  EXPECT_EQ(cache.idle_bytes(), 0u);  // the idle buffer made room
}

// Two decodes at the same time on a full cache: the first evicts a chunk
// and reuses its buffer, the second finds the cache with room and takes
// new memory, and its Put evicts another chunk. Without a reserve that
// chunk's buffer is freed (cached plus idle would pass the capacity), so
// every later decode touches fresh memory; with one it is kept and lent
// again. Memory stays within capacity plus reserve.
TEST(ChunkCacheTest, AFullCacheKeepsItsReserveOfIdleBuffers) {
  ObjectId a = ObjectId::Of(AsBytes("a"));
  for (uint64_t reserve : {uint64_t{0}, uint64_t{200}}) {
    SCOPED_TRACE(reserve);
    ChunkCache cache(300, reserve);
    std::vector<const std::byte*> memory;
    for (uint32_t i = 0; i < 3; ++i) {
      auto buffer = cache.AcquireBuffer(100);
      memory.push_back(buffer->data());
      cache.Put(a, i, buffer);
    }
    auto first = cache.AcquireBuffer(100);  // evicts a/0, reuses its buffer
    EXPECT_EQ(first->data(), memory[0]);
    auto second = cache.AcquireBuffer(100);  // room for it: new memory
    cache.Put(a, 3, first);
    cache.Put(a, 4, second);  // evicts a/1
    EXPECT_EQ(cache.Get(a, 1), nullptr);
    EXPECT_EQ(cache.size_bytes(), 300u);
    if (reserve == 0) {
      EXPECT_EQ(cache.idle_bytes(), 0u);
      continue;
    }
    EXPECT_EQ(cache.idle_bytes(), 100u);
    EXPECT_EQ(cache.AcquireBuffer(100)->data(), memory[1]);
    // Four decodes in flight (one buffer idle, one evicted chunk, two new
    // ones) let go with 200 bytes cached: the reserve keeps two, not one.
    std::vector<std::shared_ptr<ChunkBuffer>> lent;
    for (int i = 0; i < 4; ++i) lent.push_back(cache.AcquireBuffer(100));
    lent.clear();
    EXPECT_EQ(cache.size_bytes(), 200u);
    EXPECT_EQ(cache.idle_bytes(), 200u);
    // Filled with memory from elsewhere, the cache keeps the reserve's
    // idle buffers and no more: capacity plus reserve in all.
    for (uint32_t i = 10; i < 13; ++i) {
      auto outside = std::make_shared<ChunkBuffer>();
      outside->Resize(100);
      cache.Put(a, i, outside);
    }
    EXPECT_EQ(cache.size_bytes(), 300u);
    EXPECT_EQ(cache.idle_bytes(), 200u);
  }
}

TEST(ChunkCacheTest, AChunkReadToItsEndLeavesTheCache) {
  ChunkCache cache(1000);
  ObjectId a = ObjectId::Of(AsBytes("a"));
  cache.Put(a, 0, cache.AcquireBuffer(100));
  cache.NoteRead(a, 0, 60);
  EXPECT_NE(cache.Get(a, 0), nullptr);
  cache.NoteRead(a, 0, 39);
  EXPECT_NE(cache.Get(a, 0), nullptr);
  cache.NoteRead(a, 0, 1);
  EXPECT_EQ(cache.Get(a, 0), nullptr);
  EXPECT_EQ(cache.size_bytes(), 0u);
  EXPECT_EQ(cache.idle_bytes(), 100u);
  cache.NoteRead(a, 1, 5);  // not cached: nothing happens
}

TEST(ChunkCacheTest, LentBuffersOutliveTheCache) {
  std::shared_ptr<ChunkBuffer> kept;
  {
    ChunkCache cache(1000);
    kept = cache.AcquireBuffer(64);
    std::fill_n(kept->data(), 64, std::byte{7});
    cache.AcquireBuffer(64).reset();  // idle when the cache goes
  }
  EXPECT_EQ(kept->data()[63], std::byte{7});
  kept.reset();  // freed: the idle list is closed
}

}  // namespace
}  // namespace ckptfs
