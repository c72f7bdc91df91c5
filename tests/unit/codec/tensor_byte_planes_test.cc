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
    for (size_t count : {0u, 1u, 15u, 16u, 17u, 31u, 32u, 33u, 1000u}) {
      std::vector<std::byte> in = testing::RandomBytes(width * count, static_cast<uint32_t>(count));
      std::vector<std::byte> planes(width * count + 1);
      std::array<std::byte*, 4> p{};
      for (size_t k = 0; k < width; ++k) p[k] = planes.data() + k * count;
      SplitBytePlanes(in.data(), count, width, p.data());
      std::array<const std::byte*, 4> cp{p[0], p[1], p[2], p[3]};
      std::vector<std::byte> back(width * count);
      MergeBytePlanes(cp.data(), count, width, back.data());
      ASSERT_EQ(back, in) << "width " << width << " count " << count;
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
