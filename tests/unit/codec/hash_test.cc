// Checksum64, ObjectId::Of and the two streams take the AVX2 or AVX-512 build
// of XXH3 on CPUs that have it; the values must equal the baseline build's for
// every input length (XXH3 has separate paths for short, medium, long and
// multi-block inputs) and, for the streams, every way of splitting the input.
#include <gtest/gtest.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "codec/common/hash.h"
#include "codec/common/hash_wide.h"
#include "codec/common/simd_level.h"

namespace ckptfs {
namespace {

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// Lengths around every XXH3 path boundary and stripe/block multiples.
const size_t kLengths[] = {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4096 + 7, 65536 + 63,
                           (1u << 20) + 3};

TEST(HashTest, Checksum64MatchesBaselineXxh3) {
  for (size_t n : kLengths) {
    auto data = RandomBytes(n, static_cast<uint32_t>(n));
    EXPECT_EQ(Checksum64(data), XXH3_64bits(data.data(), data.size())) << n << " bytes";
  }
}

TEST(HashTest, ObjectIdMatchesBaselineXxh3_128) {
  for (size_t n : kLengths) {
    auto data = RandomBytes(n, static_cast<uint32_t>(n) + 1);
    XXH128_hash_t want = XXH3_128bits(data.data(), data.size());
    ObjectId id = ObjectId::Of(data);
    uint64_t high = 0, low = 0;
    for (int i = 0; i < 8; ++i) {
      high = high << 8 | id.bytes[i];
      low = low << 8 | id.bytes[8 + i];
    }
    EXPECT_EQ(high, want.high64) << n << " bytes";
    EXPECT_EQ(low, want.low64) << n << " bytes";
  }
}

// The input in pieces of `piece` bytes (the last one shorter).
template <typename Stream>
void UpdateInPieces(Stream& stream, const std::vector<std::byte>& data, size_t piece) {
  for (size_t at = 0; at < data.size(); at += piece)
    stream.Update(ByteSpan(data.data() + at, std::min(piece, data.size() - at)));
}

TEST(HashTest, StreamsMatchOneShotHashesForEverySplit) {
  for (size_t n : kLengths) {
    auto data = RandomBytes(n, static_cast<uint32_t>(n) + 3);
    for (size_t piece : {size_t{1}, size_t{7}, size_t{255}, size_t{256}, size_t{16384}, size_t{1} << 21}) {
      if (piece == 1 && n > 70000) continue;  // byte by byte only where it stays quick
      Checksum64Stream sum;
      UpdateInPieces(sum, data, piece);
      EXPECT_EQ(sum.Digest(), XXH3_64bits(data.data(), data.size())) << n << " bytes in pieces of " << piece;
      ObjectIdStream id;
      UpdateInPieces(id, data, piece);
      EXPECT_EQ(id.Digest(), ObjectId::Of(data)) << n << " bytes in pieces of " << piece;
    }
  }
}

#if defined(__x86_64__)
// One vector width's build against the baseline: one-shot and streaming.
#define CKPTFS_WIDE_XXH3_MATCHES_BASELINE(ns)                                                   \
  for (size_t n : kLengths) {                                                                   \
    auto data = RandomBytes(n, static_cast<uint32_t>(n) + 2);                                   \
    EXPECT_EQ(ns::Xxh3_64(data.data(), data.size()), XXH3_64bits(data.data(), data.size())) << n; \
    XXH128_hash_t want = XXH3_128bits(data.data(), data.size());                                \
    uint64_t high = 0, low = 0;                                                                 \
    ns::Xxh3_128(data.data(), data.size(), &high, &low);                                        \
    EXPECT_EQ(high, want.high64) << n;                                                          \
    EXPECT_EQ(low, want.low64) << n;                                                            \
    XXH3_state_t* state = XXH3_createState();                                                   \
    XXH3_64bits_reset(state);                                                                   \
    for (size_t at = 0; at < n; at += 1000) ns::Xxh3_64Update(state, data.data() + at, std::min<size_t>(1000, n - at)); \
    EXPECT_EQ(ns::Xxh3_64Digest(state), XXH3_64bits(data.data(), data.size())) << n;            \
    XXH3_128bits_reset(state);                                                                  \
    for (size_t at = 0; at < n; at += 1000) ns::Xxh3_128Update(state, data.data() + at, std::min<size_t>(1000, n - at)); \
    ns::Xxh3_128Digest(state, &high, &low);                                                     \
    EXPECT_EQ(high, want.high64) << n;                                                          \
    EXPECT_EQ(low, want.low64) << n;                                                            \
    XXH3_freeState(state);                                                                      \
  }

TEST(HashTest, Avx2BuildMatchesBaseline) {
  if (!CpuHasSimd(SimdLevel::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  CKPTFS_WIDE_XXH3_MATCHES_BASELINE(hash_avx2)
}

TEST(HashTest, Avx512BuildMatchesBaseline) {
  if (!CpuHasSimd(SimdLevel::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  CKPTFS_WIDE_XXH3_MATCHES_BASELINE(hash_avx512)
}
#endif

}  // namespace
}  // namespace ckptfs
