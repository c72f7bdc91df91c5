#include "codec/tensor/element_ranges.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "codec/tensor/rans_model.h"

namespace ckptfs {
namespace {

// The fields of r that a model reads: a cluster's bounds only where it has bytes.
std::array<uint32_t, 4> Used(const rans::ByteRanges& r) {
  return {r.low_min < 0x80 ? r.low_min : 0x80, r.low_min < 0x80 ? r.low_max : 0, r.high_max >= 0x80 ? r.high_min : 0xff,
          r.high_max >= 0x80 ? r.high_max : 0};
}

// Elements of `width` bytes whose bytes come from [lo, hi], about one in
// `zero_every` all zero.
std::vector<std::byte> Elements(size_t count, size_t width, uint32_t lo, uint32_t hi, size_t zero_every,
                                uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(count * width);
  for (size_t i = 0; i < count; ++i) {
    const bool zero = zero_every != 0 && rng() % zero_every == 0;
    for (size_t k = 0; k < width; ++k)
      v[i * width + k] = std::byte(zero ? 0 : static_cast<uint8_t>((lo + rng() % (hi - lo + 1)) & 0xff));
  }
  return v;
}

TEST(ElementByteRanges, EveryLevelAgreesWithThePlanesOwnRanges) {
  struct Case {
    uint32_t lo, hi;
    size_t zero_every;
  };
  // Low bytes only, high only, both (a float's sign), and with zero elements.
  const Case cases[] = {{0x30, 0x45, 0}, {0x30, 0x45, 7}, {0xb0, 0xc4, 5}, {0x70, 0x8f, 3}, {0x01, 0x02, 2}};
  for (size_t width : {size_t{2}, size_t{4}}) {
    for (const Case& c : cases) {
      const size_t count = 1000 + 17;
      std::vector<std::byte> in = Elements(count, width, c.lo, c.hi, c.zero_every, static_cast<uint32_t>(c.lo + width));
      // The planes of the non-zero elements, and of all.
      std::vector<std::vector<uint8_t>> kept(width), all(width);
      for (size_t i = 0; i < count; ++i) {
        bool zero = true;
        for (size_t k = 0; k < width; ++k) zero = zero && in[i * width + k] == std::byte{0};
        for (size_t k = 0; k < width; ++k) {
          all[k].push_back(static_cast<uint8_t>(in[i * width + k]));
          if (!zero) kept[k].push_back(static_cast<uint8_t>(in[i * width + k]));
        }
      }
      for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
        if (!CpuHasSimd(level)) continue;
        ElementByteRanges ranges(width);
        // In pieces of odd sizes, as a scan adds its blocks.
        for (size_t at = 0, piece = 1; at < count; at += piece, piece = piece * 3 % 97 + 1)
          ranges.Add(in.data() + at * width, std::min(piece, count - at), level);
        for (size_t k = 0; k < width; ++k) {
          EXPECT_EQ(Used(ranges.Plane(k, false)), Used(rans::FindByteRanges(kept[k].data(), kept[k].size())))
              << "width " << width << " lo " << c.lo << " level " << static_cast<int>(level) << " plane " << k;
          if (c.zero_every != 0) {
            EXPECT_EQ(Used(ranges.Plane(k, true)), Used(rans::FindByteRanges(all[k].data(), all[k].size())))
                << "with zeros, width " << width << " lo " << c.lo << " level " << static_cast<int>(level);
          }
          // Exactly the same values on every path.
          ElementByteRanges scalar(width);
          scalar.Add(in.data(), count, SimdLevel::kScalar);
          const rans::ByteRanges a = ranges.Plane(k, false), b = scalar.Plane(k, false);
          EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace ckptfs
