// Packing of quantizer symbols into groups of eight (symbol_groups.h): the
// BMI2 path writes whole words and lets the next group overwrite their
// excess, so it must give the portable path's bytes and never write past
// the packed size, for every width and group count; the BMI2 unpack loads
// whole words and must read nothing past the packed bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "codec/tensor/lossy/element_ops.h"
#include "codec/tensor/lossy/symbol_groups.h"

namespace ckptfs::lossy {
namespace {

TEST(SymbolGroups, VectorPackEqualsPortableAndStaysInsideItsBytes) {
  std::mt19937 rng(5);
  constexpr size_t kCanary = 16;
  for (uint32_t bits = 1; bits <= 8; ++bits) {
    for (uint64_t groups = 0; groups <= 40; ++groups) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " groups " + std::to_string(groups));
      const uint64_t count = groups * kPackGroup;
      std::vector<uint8_t> symbols(count);
      for (uint8_t& s : symbols) s = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
      const size_t size = groups * bits;
      std::vector<std::byte> portable(size + kCanary, std::byte{0xA5}), vector(size + kCanary, std::byte{0xA5});
      PackGroups(symbols.data(), count, bits, portable.data(), /*use_simd=*/false);
      PackGroups(symbols.data(), count, bits, vector.data(), /*use_simd=*/true);
      ASSERT_EQ(vector, portable);  // the canaries past `size` included
      for (size_t i = size; i < size + kCanary; ++i) ASSERT_EQ(vector[i], std::byte{0xA5}) << i;
      // From a buffer of exactly the packed size (a read past it is a heap
      // overflow under the sanitizers).
      std::vector<std::byte> exact(vector.begin(), vector.begin() + static_cast<ptrdiff_t>(size));
      std::vector<uint8_t> back(count), back_portable(count);
      UnpackGroups(exact.data(), count, bits, back.data(), /*use_simd=*/true);
      UnpackGroups(exact.data(), count, bits, back_portable.data(), /*use_simd=*/false);
      ASSERT_EQ(back, symbols);
      ASSERT_EQ(back_portable, symbols);
    }
  }
}

}  // namespace
}  // namespace ckptfs::lossy
