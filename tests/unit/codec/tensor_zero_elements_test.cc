#include "codec/tensor/zero_elements.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include "blob_test_util.h"

namespace ckptfs {
namespace {

bool IsZeroElement(const std::vector<std::byte>& in, size_t width, size_t i) {
  return std::all_of(in.begin() + width * i, in.begin() + width * (i + 1), [](std::byte b) { return b == std::byte{0}; });
}

// Splits the kept elements of `in` into planes with every instruction set
// the CPU has; the planes lie back to back with a guard byte after them,
// which the split must leave alone. Calls check(planes, level) for each.
template <typename Check>
void SplitAtEveryLevel(const std::vector<std::byte>& in, size_t count, size_t width,
                       const std::vector<std::byte>& mask, size_t kept, Check check) {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (!CpuHasSimd(level)) continue;
    std::vector<std::byte> planes(width * kept + 1, std::byte{0x5a});
    std::array<std::byte*, 4> p{};
    for (size_t k = 0; k < width; ++k) p[k] = planes.data() + k * kept;
    SplitNonZeroElements(in.data(), count, width, mask.data(), kept, p.data(), level);
    EXPECT_EQ(planes.back(), std::byte{0x5a}) << "level " << static_cast<int>(level);
    check(p, level);
  }
}

TEST(ZeroElements, MaskSplitAndUnpackForEveryTailLength) {
  for (size_t width : {2u, 4u}) {
    for (size_t count : {0u, 1u, 7u, 8u, 9u, 15u, 16u, 17u, 31u, 32u, 33u, 63u, 1000u}) {
      std::vector<std::byte> in = testing::RandomBytes(width * count, static_cast<uint32_t>(count + width));
      // Zero every third element, and one byte of every fifth (not zero then).
      for (size_t i = 0; i < count; i += 3) std::fill_n(in.begin() + width * i, width, std::byte{0});
      for (size_t i = 1; i < count; i += 5) in[width * i] = std::byte{0};
      std::vector<std::byte> mask((count + 7) / 8, std::byte{0xee});
      const size_t zeros = ZeroElementMask(in.data(), count, width, mask.data());
      size_t expect_zeros = 0;
      for (size_t i = 0; i < count; ++i) {
        const bool bit = (static_cast<uint8_t>(mask[i / 8]) >> (i % 8)) & 1;
        ASSERT_EQ(bit, IsZeroElement(in, width, i)) << i;
        ASSERT_TRUE(bit || i % 3 != 0) << i;
        expect_zeros += bit;
      }
      ASSERT_EQ(zeros, expect_zeros);
      if (count % 8 != 0) {
        EXPECT_EQ(static_cast<uint8_t>(mask.back()) >> (count % 8), 0);
      }
      // The planes lie back to back with a guard byte after them: the
      // split must write exactly its bytes.
      const size_t kept = count - zeros;
      std::vector<std::byte> packed;
      for (size_t i = 0; i < count; ++i)
        if (!IsZeroElement(in, width, i)) packed.insert(packed.end(), in.begin() + width * i, in.begin() + width * (i + 1));
      SplitAtEveryLevel(in, count, width, mask, kept, [&](const std::array<std::byte*, 4>& p, SimdLevel level) {
        for (size_t j = 0; j < kept; ++j)
          for (size_t k = 0; k < width; ++k)
            ASSERT_EQ(p[k][j], packed[width * j + k]) << j << " " << k << " level " << static_cast<int>(level);
      });
      packed.resize(width * count);
      for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!CpuHasSimd(level)) continue;
        std::vector<std::byte> back(width * count, std::byte{0x77});
        UnpackNonZeroElements(packed.data(), mask.data(), count, width, back.data(), level);
        ASSERT_EQ(back, in) << "width " << width << " count " << count << " level " << static_cast<int>(level);
      }
    }
  }
}

TEST(ZeroElements, SplitSkipsLongZeroRuns) {
  // Non-zero elements at both ends of long zero runs, so the split's last
  // kept bytes come after the point where fewer than 8 remain.
  for (size_t width : {2u, 4u}) {
    const size_t count = 5000;
    std::vector<std::byte> in(width * count, std::byte{0});
    for (size_t i : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 2500u, 4990u, 4999u}) in[width * i + width - 1] = std::byte(i % 200 + 1);
    std::vector<std::byte> mask((count + 7) / 8);
    const size_t kept = count - ZeroElementMask(in.data(), count, width, mask.data());
    ASSERT_EQ(kept, 13u);
    SplitAtEveryLevel(in, count, width, mask, kept, [&](const std::array<std::byte*, 4>& p, SimdLevel) {
      EXPECT_EQ(p[width - 1][10], std::byte(2500 % 200 + 1));
      EXPECT_EQ(p[width - 1][12], std::byte(4999 % 200 + 1));
      EXPECT_EQ(p[0][12], std::byte{0});
    });
  }
}

}  // namespace
}  // namespace ckptfs
