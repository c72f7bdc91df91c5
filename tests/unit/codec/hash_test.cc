// Checksum64 and ObjectId::Of take the AVX2 build of XXH3 on CPUs that have
// it; the values must equal the baseline build's for every input length
// (XXH3 has separate paths for short, medium, long and multi-block inputs).
#include <gtest/gtest.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

#include "codec/common/hash.h"
#include "codec/common/hash_avx2.h"
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

#if defined(__x86_64__)
TEST(HashTest, Avx2BuildMatchesBaseline) {
  if (!CpuHasSimd(SimdLevel::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  for (size_t n : kLengths) {
    auto data = RandomBytes(n, static_cast<uint32_t>(n) + 2);
    EXPECT_EQ(hash_avx2::Xxh3_64(data.data(), data.size()), XXH3_64bits(data.data(), data.size())) << n;
    XXH128_hash_t want = XXH3_128bits(data.data(), data.size());
    uint64_t high = 0, low = 0;
    hash_avx2::Xxh3_128(data.data(), data.size(), &high, &low);
    EXPECT_EQ(high, want.high64) << n;
    EXPECT_EQ(low, want.low64) << n;
  }
}
#endif

}  // namespace
}  // namespace ckptfs
