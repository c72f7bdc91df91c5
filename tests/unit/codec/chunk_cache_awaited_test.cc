// The chunk cache's awaited chunks: a file's chunks decoded ahead of its
// reader, as inputs of earlier chunks (a step-predicted version's weights
// read its optimizer state, which comes after them), wait for the reader
// outside the LRU instead of being evicted and decoded a second time.
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "adam_run_test_util.h"
#include "blob_test_util.h"
#include "codec/container/blob.h"

namespace ckptfs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

std::shared_ptr<const ChunkBuffer> Filled(size_t n, uint8_t v) {
  auto buffer = std::make_shared<ChunkBuffer>();
  buffer->Resize(n);
  std::fill_n(buffer->data(), n, std::byte{v});
  return buffer;
}

TEST(ChunkCacheAwaited, AwaitedChunksOutlastTheLruUntilTaken) {
  ChunkCache cache(/*capacity=*/200, /*idle_reserve=*/0, /*awaited=*/250);
  const ObjectId a = ObjectId::Of(AsBytes("a")), b = ObjectId::Of(AsBytes("b"));
  cache.Put(a, 5, Filled(100, 5), /*awaited=*/true);
  cache.Put(a, 6, Filled(100, 6), /*awaited=*/true);
  cache.Put(a, 7, Filled(100, 7), /*awaited=*/true);  // past the room: an ordinary entry
  EXPECT_EQ(cache.awaited_bytes(), 200u);
  for (uint32_t c = 0; c < 4; ++c) cache.Put(b, c, Filled(100, 1));  // LRU pressure
  EXPECT_EQ(cache.Get(a, 7), nullptr) << "the entry past the room is evicted like any other";
  ASSERT_NE(cache.Get(a, 5), nullptr);
  ASSERT_NE(cache.Get(a, 6), nullptr);
  EXPECT_EQ(cache.size_bytes(), 400u);  // 200 of LRU, 200 awaited

  // Released (the reader is done with a/5): it joins the LRU, pushing out its oldest.
  ASSERT_EQ(cache.Get(a, 5, /*release_awaited=*/true)->data()[0], std::byte{5});
  EXPECT_EQ(cache.awaited_bytes(), 100u);
  EXPECT_EQ(cache.size_bytes(), 300u);
  EXPECT_EQ(cache.Get(b, 2), nullptr);
  for (uint32_t c = 10; c < 12; ++c) cache.Put(b, c, Filled(100, 1));
  EXPECT_EQ(cache.Get(a, 5), nullptr) << "released: evicted by the LRU";
  ASSERT_NE(cache.Get(a, 6), nullptr);

  // A read to its end drops an awaited chunk like any other.
  EXPECT_TRUE(cache.NoteRead(a, 6, 100));
  EXPECT_EQ(cache.awaited_bytes(), 0u);
  EXPECT_EQ(cache.size_bytes(), 200u);
}

TEST(ChunkCacheAwaited, AChunkOthersStillReadJoinsTheLruOnceReadWhole) {
  ChunkCache cache(100, 0, 1000);
  const ObjectId a = ObjectId::Of(AsBytes("a")), b = ObjectId::Of(AsBytes("b"));
  cache.Put(a, 0, Filled(100, 1), true);
  EXPECT_FALSE(cache.NoteRead(a, 0, 60, /*keep=*/true));
  EXPECT_EQ(cache.awaited_bytes(), 100u);
  EXPECT_TRUE(cache.NoteRead(a, 0, 40, true));  // read whole: kept, as an ordinary entry
  EXPECT_FALSE(cache.NoteRead(a, 0, 10, true)) << "reported once";
  EXPECT_EQ(cache.awaited_bytes(), 0u);
  ASSERT_NE(cache.Get(a, 0), nullptr);
  cache.Put(b, 0, Filled(100, 2));
  EXPECT_EQ(cache.Get(a, 0), nullptr) << "in the LRU now";
}

TEST(ChunkCacheAwaited, ReleasingABlobLetsTheLruEvictItsChunks) {
  ChunkCache cache(100, 0, 1000);
  const ObjectId a = ObjectId::Of(AsBytes("a")), b = ObjectId::Of(AsBytes("b"));
  for (uint32_t c = 0; c < 3; ++c) cache.Put(a, c, Filled(100, 1), true);
  cache.Put(b, 0, Filled(100, 2), true);
  EXPECT_EQ(cache.awaited_bytes(), 400u);
  cache.ReleaseAwaited(a);  // a's reader is gone: a's chunks go, down to the capacity
  EXPECT_EQ(cache.awaited_bytes(), 100u);
  EXPECT_LE(cache.size_bytes() - cache.awaited_bytes(), 100u);
  EXPECT_NE(cache.Get(b, 0), nullptr);
  // Without room nothing is kept awaited.
  ChunkCache plain(100);
  plain.Put(a, 0, Filled(100, 1), true);
  EXPECT_EQ(plain.awaited_bytes(), 0u);
  EXPECT_NE(plain.Get(a, 0), nullptr);
}

// Counts the decodes of each chunk of one blob: every decode views its
// stored bytes once.
class CountingFile final : public RandomAccessFile {
 public:
  explicit CountingFile(std::vector<std::byte> bytes) : file_(std::move(bytes)) {}
  uint64_t Size() const override { return file_.Size(); }
  Status ReadAt(uint64_t offset, MutableByteSpan out) const override {
    Count(offset);
    return file_.ReadAt(offset, out);
  }
  ByteSpan Contiguous() const override { return {}; }  // every read goes through View or ReadAt
  ByteSpan View(uint64_t offset, uint64_t length) const override {
    Count(offset);
    ByteSpan whole = file_.Contiguous();
    return whole.subspan(offset, length);
  }
  int reads_at(uint64_t offset) const {
    std::lock_guard lock(mu_);
    auto it = reads_.find(offset);
    return it == reads_.end() ? 0 : it->second;
  }

 private:
  void Count(uint64_t offset) const {
    std::lock_guard lock(mu_);
    ++reads_[offset];
  }
  MemoryFile file_;
  mutable std::mutex mu_;
  mutable std::map<uint64_t, int> reads_;
};

// The newest blob of a chain opened through a cache whose LRU holds two
// chunks, with `awaited_room`, counting the decodes of its chunks.
struct CountedNewest {
  CountedNewest(AdamChain& chain, uint64_t awaited_room)
      : file(std::make_shared<CountingFile>(chain.blobs.back())), cache(/*capacity=*/64 << 10, 0, awaited_room) {
    auto opened = BlobReader::Open(file, chain.ids.back(), &chain.resolver, &cache);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (opened.ok()) reader = *opened;
  }
  // How many chunks were decoded more than once so far.
  int ChunksTwice() const {
    int twice = 0;
    for (const ChunkInfo& c : reader->chunks())
      if (c.stored_length > 0 && file->reads_at(c.stored_offset) > 1) ++twice;
    return twice;
  }
  std::shared_ptr<CountingFile> file;
  ChunkCache cache;
  std::shared_ptr<const BlobReader> reader;  // after `cache`: let go first
};

// Reads the newest version as a stream, piece by piece from the start;
// returns how many of its chunks were decoded more than once.
int ChunksDecodedTwice(AdamChain& chain, uint64_t awaited_room, uint64_t* awaited_seen) {
  CountedNewest n(chain, awaited_room);
  if (!n.reader) return -1;
  std::vector<std::byte> got;
  {
    const ReaderStream stream(*n.reader);
    const uint64_t size = n.reader->logical_size();
    for (uint64_t at = 0; at < size; at += 8192) {
      std::vector<BlobReader::Piece> pieces;
      EXPECT_TRUE(n.reader->ReadPieces(at, std::min<uint64_t>(8192, size - at), &pieces).ok());
      for (const BlobReader::Piece& p : pieces) got.insert(got.end(), p.data.begin(), p.data.end());
      *awaited_seen = std::max(*awaited_seen, n.cache.awaited_bytes());
    }
  }
  EXPECT_TRUE(got == chain.newest());
  EXPECT_EQ(n.cache.awaited_bytes(), 0u) << "the stream closed: nothing is awaited";
  return n.ChunksTwice();
}

TEST(ChunkCacheAwaited, AStreamDecodesEachChunkOfAPredictedVersionOnce) {
  AdamChain chain;
  BuildAdamChain(&chain);
  ASSERT_EQ(chain.blobs.size(), 3u);
  uint64_t awaited = 0;
  EXPECT_EQ(ChunksDecodedTwice(chain, 4 << 20, &awaited), 0);
  EXPECT_GT(awaited, 64u << 10) << "the weights read state that did not fit the LRU";
  // The same read without the room decodes state again (what the room is for).
  uint64_t none = 0;
  EXPECT_GT(ChunksDecodedTwice(chain, 0, &none), 0);
  EXPECT_EQ(none, 0u);
}

// Chunks of the newest version decoded more than once by DecodeToSink on
// `threads` threads through a 64 KiB LRU and `awaited_room`.
int DecodedTwiceBySink(AdamChain& chain, unsigned threads, uint64_t awaited_room) {
  CountedNewest n(chain, awaited_room);
  if (!n.reader) return -1;
  VectorSink sink;
  EXPECT_TRUE(DecodeToSink(*n.reader, &sink, threads, 64 << 10).ok());
  EXPECT_TRUE(sink.bytes == chain.newest());
  EXPECT_EQ(n.cache.awaited_bytes(), 0u);
  return n.ChunksTwice();
}

TEST(ChunkCacheAwaited, DecodeToSinkIsAStream) {
  AdamChain chain;
  BuildAdamChain(&chain);
  EXPECT_EQ(DecodedTwiceBySink(chain, 1, 4 << 20), 0);
  EXPECT_GT(DecodedTwiceBySink(chain, 1, 0), 0) << "without the room, state is decoded again";
  // On two threads pieces are decoded out of order: a chunk the reader
  // took whole may leave the cache just before another thread's earlier
  // chunk reads it (a race, one or two chunks in some runs).
  const int two = DecodedTwiceBySink(chain, 2, 4 << 20);
  const int two_without = DecodedTwiceBySink(chain, 2, 0);
  EXPECT_LT(two, two_without);
}

}  // namespace
}  // namespace ckptfs
