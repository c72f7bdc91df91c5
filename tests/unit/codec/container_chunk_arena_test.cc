#include "codec/container/chunk_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "codec/container/chunk_buffer.h"

namespace ckptfs {
namespace {

struct Held {
  std::byte* p;
  size_t n;
  uint8_t fill;
};

void Fill(const Held& h) { std::memset(h.p, h.fill, h.n); }
bool Intact(const Held& h) {
  for (size_t i = 0; i < h.n; ++i)
    if (h.p[i] != std::byte{h.fill}) return false;
  return true;
}

TEST(ChunkArenaTest, AllocationsAreAlignedAndDisjoint) {
  ChunkArena arena(size_t{1} << 30);
  std::vector<Held> held;
  std::mt19937 rng(1);
  // Sizes like a transformer's chunks, over several blocks.
  for (int i = 0; i < 60; ++i) {
    const size_t n = 1 + rng() % (ChunkArena::kLargest - 1);
    Held h{arena.Allocate(n), n, static_cast<uint8_t>(i)};
    EXPECT_EQ(reinterpret_cast<uintptr_t>(h.p) % 64, 0u);
    Fill(h);
    held.push_back(h);
  }
  for (const Held& h : held) EXPECT_TRUE(Intact(h)) << int(h.fill);
  for (const Held& h : held) arena.Free(h.p);
  // All free: the current block and at most kSpareBlocks others remain.
  EXPECT_LE(arena.blocks(), 1 + ChunkArena::kSpareBlocks);
}

TEST(ChunkArenaTest, FreedBlocksAreReused) {
  ChunkArena arena(size_t{1} << 30);
  const size_t n = ChunkArena::kBlockBytes / 4;  // four to a block (less the alignment: exactly)
  std::vector<std::byte*> first;
  for (int i = 0; i < 12; ++i) first.push_back(arena.Allocate(n));
  EXPECT_EQ(arena.blocks(), 3u);
  for (std::byte* p : first) arena.Free(p);
  EXPECT_EQ(arena.blocks(), 3u);  // the current one and two spares
  std::vector<std::byte*> again;
  for (int i = 0; i < 12; ++i) again.push_back(arena.Allocate(n));
  EXPECT_EQ(arena.blocks(), 3u);  // no new memory for the same load
  for (std::byte* p : again) arena.Free(p);
  // An emptied current block is cut from its start again.
  std::byte* a = arena.Allocate(1000);
  arena.Free(a);
  EXPECT_EQ(arena.Allocate(1000), a);
  arena.Free(a);
}

TEST(ChunkArenaTest, BeyondTheSparesBlocksAreFreed) {
  ChunkArena arena(size_t{1} << 30);
  const size_t n = ChunkArena::kBlockBytes / 2 - 64;  // two to a block
  std::vector<std::byte*> held;
  for (int i = 0; i < 12; ++i) held.push_back(arena.Allocate(n));
  EXPECT_EQ(arena.blocks(), 6u);
  for (std::byte* p : held) arena.Free(p);
  EXPECT_EQ(arena.blocks(), 1 + ChunkArena::kSpareBlocks);
}

TEST(ChunkArenaTest, PastItsBoundItGivesNothingAndBuffersUseTheHeap) {
  auto arena = std::make_shared<ChunkArena>(2 * ChunkArena::kBlockBytes);
  const size_t n = ChunkArena::kBlockBytes / 2 - 64;
  std::vector<std::byte*> held;
  for (int i = 0; i < 4; ++i) held.push_back(arena->Allocate(n));
  for (std::byte* p : held) EXPECT_NE(p, nullptr);
  EXPECT_EQ(arena->Allocate(n), nullptr);  // a third block would pass the bound
  EXPECT_EQ(arena->blocks(), 2u);
  {
    ChunkBuffer overflow(arena);
    overflow.Resize(n);
    ASSERT_NE(overflow.data(), nullptr);
    std::memset(overflow.data(), 3, overflow.size());
  }  // its memory was the heap's: the arena's blocks are untouched
  EXPECT_EQ(arena->blocks(), 2u);
  arena->Free(held[0]);
  EXPECT_EQ(arena->Allocate(n), nullptr);  // the block is still half in use
  arena->Free(held[1]);
  std::byte* again = arena->Allocate(n);  // an empty block is reused
  EXPECT_NE(again, nullptr);
  for (std::byte* p : {again, held[2], held[3]}) arena->Free(p);
}

TEST(ChunkArenaTest, ThreadsAllocateAndFreeTogether) {
  ChunkArena arena(size_t{1} << 30);
  auto work = [&arena](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<Held> held;
    for (int i = 0; i < 4000; ++i) {
      if (!held.empty() && rng() % 2 == 0) {
        const size_t k = rng() % held.size();
        ASSERT_TRUE(Intact(held[k]));
        arena.Free(held[k].p);
        held[k] = held.back();
        held.pop_back();
      } else {
        const size_t n = 1 + rng() % (256 << 10);
        Held h{arena.Allocate(n), n, static_cast<uint8_t>(rng())};
        Fill(h);
        held.push_back(h);
      }
    }
    for (const Held& h : held) {
      ASSERT_TRUE(Intact(h));
      arena.Free(h.p);
    }
  };
  std::thread a(work, 11), b(work, 12);
  a.join();
  b.join();
  EXPECT_LE(arena.blocks(), 1 + ChunkArena::kSpareBlocks);
}

TEST(ChunkArenaTest, ChunkBuffersTakeSmallMemoryFromTheArena) {
  auto arena = std::make_shared<ChunkArena>(size_t{1} << 30);
  {
    ChunkBuffer small(arena);
    small.Resize(3 << 20);
    EXPECT_EQ(arena->blocks(), 1u);
    std::memset(small.data(), 7, small.size());
    small.Resize(1 << 20);  // shrinking keeps the memory
    EXPECT_EQ(small.capacity(), size_t{3} << 20);
    ChunkBuffer large(arena);
    large.Resize(ChunkArena::kLargest);  // its own huge pages
    std::memset(large.data(), 1, large.size());
    EXPECT_EQ(arena->blocks(), 1u);
    ChunkBuffer second(arena);
    second.Resize(3 << 20);
    EXPECT_EQ(arena->blocks(), 1u);  // 6 MiB of an 8 MiB block
    ChunkBuffer third(arena);
    third.Resize(3 << 20);
    EXPECT_EQ(arena->blocks(), 2u);
    small.Resize(ChunkArena::kLargest + 1);  // moves out of the arena
    std::memset(small.data(), 2, small.size());
  }
  EXPECT_LE(arena->blocks(), 1 + ChunkArena::kSpareBlocks);
  ChunkBuffer plain;  // without an arena: the heap
  plain.Resize(1000);
  EXPECT_NE(plain.data(), nullptr);
}

}  // namespace
}  // namespace ckptfs
