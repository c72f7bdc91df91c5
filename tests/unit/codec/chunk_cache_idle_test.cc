// What the chunk cache keeps of its memory between decodes: idle buffers
// lent only to chunks of about their size, idle buffers in the awaited
// room while a stream is open, and the decode scratches let go once no
// stream is.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "codec/container/blob.h"
#include "codec/tensor/scratch_pool.h"

namespace ckptfs {
namespace {

TEST(ChunkCacheIdle, ASmallChunkGetsNoLargeIdleBuffer) {
  ChunkCache cache(1 << 20);
  auto large = cache.AcquireBuffer(4096);
  const std::byte* large_memory = large->data();
  large.reset();
  ASSERT_EQ(cache.idle_bytes(), 4096u);
  // The cache counts a chunk's size: 4096 bytes behind a chunk of 100
  // would be memory nothing counts.
  auto small = cache.AcquireBuffer(100);
  EXPECT_NE(small->data(), large_memory);
  EXPECT_EQ(small->capacity(), 100u);
  EXPECT_EQ(cache.idle_bytes(), 4096u);
  // Half the size or more: the idle buffer is lent.
  auto half = cache.AcquireBuffer(2048);
  EXPECT_EQ(half->data(), large_memory);
  EXPECT_EQ(cache.idle_bytes(), 0u);
}

std::shared_ptr<const ChunkBuffer> Elsewhere(size_t n) {
  auto buffer = std::make_shared<ChunkBuffer>();  // memory that is not the cache's
  buffer->Resize(n);
  return buffer;
}

TEST(ChunkCacheIdle, IdleBuffersTakeTheAwaitedRoomOnlyWhileAStreamIsOpen) {
  const ObjectId a = ObjectId::Of(AsBytes("a"));
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    ChunkCache cache(/*capacity=*/300, /*idle_reserve=*/0, /*awaited=*/400);
    if (stream) cache.StreamOpened();
    for (uint32_t c = 0; c < 3; ++c) cache.Put(a, c, Elsewhere(100));  // the LRU is full
    std::vector<std::shared_ptr<ChunkBuffer>> lent;
    for (int i = 0; i < 6; ++i) lent.push_back(cache.AcquireBuffer(100));  // the first evicts a/0
    lent.clear();  // decodes done, their chunks read by now, say
    EXPECT_EQ(cache.size_bytes(), 200u);
    if (!stream) {
      EXPECT_EQ(cache.idle_bytes(), 100u) << "cached plus idle stay within the capacity";
      continue;
    }
    EXPECT_EQ(cache.idle_bytes(), 500u) << "five kept: the capacity and the awaited room, less what is cached";
    // Awaited chunks take their room back from the idle buffers.
    cache.Put(a, 10, Elsewhere(100), /*awaited=*/true);
    cache.Put(a, 11, Elsewhere(100), /*awaited=*/true);
    EXPECT_EQ(cache.awaited_bytes(), 200u);
    EXPECT_EQ(cache.idle_bytes(), 300u);
    cache.StreamClosed();
    EXPECT_EQ(cache.idle_bytes(), 0u) << "no stream: cached plus idle within the capacity again";
  }
}

TEST(ChunkCacheIdle, ScratchesAreLetGoOnceNoStreamIsOpen) {
  ChunkCache cache(1 << 20, 0, 1 << 20);
  cache.StreamOpened();
  cache.StreamOpened();
  {
    std::vector<CodecScratchPool::Lease> leases;
    for (int i = 0; i < 6; ++i) leases.push_back(cache.scratch_pool().Acquire());
  }
  EXPECT_EQ(cache.scratch_pool().idle(), 6u);
  cache.StreamClosed();
  EXPECT_EQ(cache.scratch_pool().idle(), 6u) << "a stream is still open";
  cache.StreamClosed();
  EXPECT_EQ(cache.scratch_pool().idle(), 2u);
}

TEST(CodecScratchPool, TrimKeepsTheMostRecentlyUsed) {
  CodecScratchPool pool(8);
  std::vector<const CodecScratch*> order;
  {
    std::vector<CodecScratchPool::Lease> leases;
    for (int i = 0; i < 4; ++i) {
      leases.push_back(pool.Acquire());
      order.push_back(&*leases.back());
    }
  }  // given back in order: the last one given back is the warmest
  pool.Trim(1);
  EXPECT_EQ(pool.idle(), 1u);
  EXPECT_EQ(&*pool.Acquire(), order.back());
  pool.Trim(5);
  EXPECT_EQ(pool.idle(), 1u);
}

// A chain decode leases one scratch per level, all at once: a chain deeper
// than the pool's minimum must find its levels' scratches again for the
// next chunk instead of making new ones (zstd contexts, buffers) each time.
TEST(CodecScratchPool, KeepsAsManyAsWereLentAtOnceUntilTrimmed) {
  CodecScratchPool pool(2);
  std::vector<const CodecScratch*> first;
  {
    std::vector<CodecScratchPool::Lease> chain;
    for (int i = 0; i < 7; ++i) {
      chain.push_back(pool.Acquire());
      first.push_back(&*chain.back());
    }
  }
  EXPECT_EQ(pool.idle(), 7u);
  {
    std::vector<CodecScratchPool::Lease> chain;
    for (int i = 0; i < 7; ++i) chain.push_back(pool.Acquire());
    for (const auto& lease : chain)
      EXPECT_NE(std::find(first.begin(), first.end(), &*lease), first.end()) << "a new scratch for a level";
    EXPECT_EQ(pool.idle(), 0u);
  }
  pool.Trim(2);
  EXPECT_EQ(pool.idle(), 2u);
  {
    std::vector<CodecScratchPool::Lease> few;
    for (int i = 0; i < 3; ++i) few.push_back(pool.Acquire());
  }
  EXPECT_EQ(pool.idle(), 3u) << "the peak since the trim";
}

}  // namespace
}  // namespace ckptfs
