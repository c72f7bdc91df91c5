#include "codec/tensor/zero_elements.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "blob_test_util.h"

namespace ckptfs {
namespace {

TEST(ZeroElements, PackAndUnpackForEveryTailLength) {
  for (size_t width : {2u, 4u}) {
    for (size_t count : {0u, 1u, 7u, 8u, 9u, 63u, 1000u}) {
      std::vector<std::byte> in = testing::RandomBytes(width * count, static_cast<uint32_t>(count + width));
      // Zero every third element, and one byte of every fifth (not zero then).
      for (size_t i = 0; i < count; i += 3) std::fill_n(in.begin() + width * i, width, std::byte{0});
      for (size_t i = 1; i < count; i += 5) in[width * i] = std::byte{0};
      const size_t zeros = CountZeroElements(in.data(), count, width);
      size_t expect_zeros = 0;
      for (size_t i = 0; i < count; ++i)
        expect_zeros += std::all_of(in.begin() + width * i, in.begin() + width * (i + 1),
                                    [](std::byte b) { return b == std::byte{0}; });
      ASSERT_EQ(zeros, expect_zeros);
      std::vector<std::byte> packed(width * count), mask((count + 7) / 8, std::byte{0xee});
      const size_t kept = PackNonZeroElements(in.data(), count, width, packed.data(), mask.data());
      ASSERT_EQ(kept, count - zeros);
      for (size_t i = 0; i < count; ++i) {
        const bool bit = (static_cast<uint8_t>(mask[i / 8]) >> (i % 8)) & 1;
        const bool zero = std::all_of(in.begin() + width * i, in.begin() + width * (i + 1),
                                      [](std::byte b) { return b == std::byte{0}; });
        ASSERT_EQ(bit, zero) << i;
        ASSERT_TRUE(bit || i % 3 != 0) << i;
      }
      if (count % 8 != 0) {
        EXPECT_EQ(static_cast<uint8_t>(mask.back()) >> (count % 8), 0);
      }
      std::vector<std::byte> back(width * count, std::byte{0x77});
      UnpackNonZeroElements(packed.data(), mask.data(), count, width, back.data());
      ASSERT_EQ(back, in) << "width " << width << " count " << count;
    }
  }
}

}  // namespace
}  // namespace ckptfs
