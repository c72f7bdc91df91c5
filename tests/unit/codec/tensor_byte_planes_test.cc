#include "codec/tensor/byte_planes.h"

#include <gtest/gtest.h>

#include <array>

#include "blob_test_util.h"

namespace ckptfs {
namespace {

TEST(BytePlanes, SplitPutsByteKOfEachElementInPlaneK) {
  std::vector<std::byte> in = testing::RandomBytes(4 * 37, 1);
  std::vector<std::byte> planes(4 * 37);
  std::array<std::byte*, 4> p{planes.data(), planes.data() + 37, planes.data() + 74, planes.data() + 111};
  SplitBytePlanes(in.data(), 37, 4, p.data());
  for (size_t i = 0; i < 37; ++i)
    for (size_t k = 0; k < 4; ++k) ASSERT_EQ(p[k][i], in[4 * i + k]) << i << " " << k;
}

TEST(BytePlanes, MergeInvertsSplitForEveryTailLength) {
  for (size_t width : {2u, 4u}) {
    for (size_t count : {0u, 1u, 15u, 16u, 17u, 31u, 32u, 33u, 63u, 64u, 65u, 1000u}) {
      std::vector<std::byte> in = testing::RandomBytes(width * count, static_cast<uint32_t>(count));
      std::vector<std::byte> planes(width * count + 1);
      std::array<std::byte*, 4> p{};
      for (size_t k = 0; k < width; ++k) p[k] = planes.data() + k * count;
      SplitBytePlanes(in.data(), count, width, p.data(), SimdLevel::kScalar);
      for (size_t i = 0; i < count; ++i)
        for (size_t k = 0; k < width; ++k) ASSERT_EQ(p[k][i], in[width * i + k]) << i << " " << k;
      std::array<const std::byte*, 4> cp{p[0], p[1], p[2], p[3]};
      std::vector<std::byte> back(width * count);
      MergeBytePlanes(cp.data(), count, width, back.data());
      ASSERT_EQ(back, in) << "width " << width << " count " << count;
      // Every level writes the same planes, and nothing past them.
      for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!CpuHasSimd(level)) continue;
        std::vector<std::byte> other(width * count + 1, std::byte{0x5c});
        std::array<std::byte*, 4> q{};
        for (size_t k = 0; k < width; ++k) q[k] = other.data() + k * count;
        SplitBytePlanes(in.data(), count, width, q.data(), level);
        EXPECT_EQ(other.back(), std::byte{0x5c}) << "wrote past the planes";
        other.pop_back();
        EXPECT_EQ(std::vector<std::byte>(planes.begin(), planes.end() - 1), other)
            << "width " << width << " count " << count << " level " << static_cast<int>(level);
      }
    }
  }
}

TEST(BytePlanes, XorBytesInPlaceAndTail) {
  std::vector<std::byte> a = testing::RandomBytes(67, 2);
  std::vector<std::byte> b = testing::RandomBytes(67, 3);
  std::vector<std::byte> x(67);
  XorBytes(a.data(), b.data(), a.size(), x.data());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(x[i], a[i] ^ b[i]);
  XorBytes(x.data(), b.data(), x.size(), x.data());  // aliasing output
  EXPECT_EQ(x, a);
}

}  // namespace
}  // namespace ckptfs
